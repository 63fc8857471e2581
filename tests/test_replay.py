"""Replay buffers against plain references: n-step returns, the sum tree, prioritized sampling."""

import numpy as np
import pytest
import torch

from rlcli.buffers.prioritized import PrioritizedReplayBuffer
from rlcli.buffers.replay import ReplayBuffer, pending_on
from rlcli.buffers.sumtree import SumTree
from rlcli.schedules import apply_schedules, build_schedules


class NoAlgo:
    """Schedules without an algorithm: only the storage's own (PER's beta, ERE's eta)."""

    default_schedules: dict = {}
    schedulable: tuple = ()

    def optimizers(self) -> list:
        return []

GAMMA = 0.9


def make(n_step: int, num_envs: int = 2, capacity: int = 1000) -> ReplayBuffer:
    return ReplayBuffer(capacity, n_step, num_envs=num_envs, obs_shape=(1,), action_shape=(), discrete=True,
                        device=torch.device("cpu"), gamma=GAMMA)


def simulate(seed: int, num_envs: int, steps: int):
    """A NEXT_STEP-autoreset vector env trace: obs values are unique ids, episodes end at random."""
    rng = np.random.default_rng(seed)
    trace, next_id = [], 0
    obs = np.arange(num_envs, dtype=np.float32)
    next_id = num_envs
    prev_done = np.zeros(num_envs, bool)
    for _ in range(steps):
        rewards = rng.normal(size=num_envs).astype(np.float32)
        terminated = rng.random(num_envs) < 0.08
        truncated = (rng.random(num_envs) < 0.08) & ~terminated
        rewards[prev_done] = 0.0
        terminated[prev_done] = False
        truncated[prev_done] = False
        next_obs = np.arange(next_id, next_id + num_envs, dtype=np.float32)
        next_id += num_envs
        done = terminated | truncated
        trace.append((obs.copy(), rewards, next_obs, terminated, done, ~prev_done))
        obs, prev_done = next_obs, done
    return trace


def reference_nstep(trace, n: int, num_envs: int):
    """Per env, per valid step: the n-step return, the bootstrap observation and its discount."""
    out = []
    for i in range(num_envs):
        steps = [(o[i], r[i], no[i], t[i], d[i]) for o, r, no, t, d, v in trace if v[i]]
        for k, (obs, *_rest) in enumerate(steps):
            ret, discount, boot = 0.0, None, None
            for j in range(n):
                if k + j >= len(steps):
                    break  # the episode has not got this far: not emitted yet
                _, r, next_obs, term, done = steps[k + j]
                ret += GAMMA**j * r
                if done or j == n - 1:
                    boot, discount = next_obs, (0.0 if term else GAMMA ** (j + 1))
                    break
            if boot is not None:
                out.append((float(obs), float(ret), float(boot), float(discount)))
    return sorted(out)


@pytest.mark.parametrize("n", [1, 3, 5])
def test_nstep_transitions_match_reference_across_terminations_truncations_and_envs(n):
    num_envs = 3
    trace = simulate(seed=n, num_envs=num_envs, steps=200)
    buf = make(n, num_envs)
    for obs, rewards, next_obs, terminated, done, valid in trace:
        buf.add(torch.as_tensor(obs).unsqueeze(-1), torch.zeros(num_envs, dtype=torch.long), rewards,
                next_obs[:, None], terminated, done, valid)
    got = sorted(
        (float(buf.obs[i, 0]), float(buf.rewards[i]), float(buf.next_obs[i, 0]), float(buf.discounts[i]))
        for i in range(len(buf))
    )
    expected = reference_nstep(trace, n, num_envs)  # sorted by obs id, which is unique per transition
    assert len(got) == len(expected) > 100
    np.testing.assert_allclose(np.array(got), np.array(expected), rtol=1e-5, atol=1e-5)


def test_replay_is_circular_and_sampling_stays_in_range():
    buf = make(1, num_envs=1, capacity=5)
    for k in range(8):
        buf.add(torch.tensor([[float(k)]]), torch.tensor([0]), np.array([k], np.float32),
                np.array([[k + 1.0]]), np.array([False]), np.array([False]), np.array([True]))
    assert len(buf) == 5
    assert sorted(buf.obs[:, 0].tolist()) == [3.0, 4.0, 5.0, 6.0, 7.0]
    batch = buf.sample(100)
    assert set(batch.obs[:, 0].tolist()) <= {3.0, 4.0, 5.0, 6.0, 7.0}
    assert torch.equal(batch.rewards, batch.obs[:, 0])


def test_joint_integer_actions_in_float_storage_wrap_around_the_ring():
    """VDN's and QMIX's joint actions (a MultiDiscrete: stored as floats) are integer tensors; a write that wraps
    the ring goes through an index tensor, which takes no other dtype (a 2M-step VDN run on LBF died at its second
    wrap, 510,000 steps in, before the fix)."""
    buf = ReplayBuffer(5, 1, num_envs=3, obs_shape=(1,), action_shape=(2,), discrete=False,
                       device=torch.device("cpu"), gamma=GAMMA)
    for k in range(4):  # rows 0-2, 3-4 then 0 (wrapping), 1-3, 4 then 0-1 (wrapping)
        actions = torch.tensor([[k, 1], [k, 2], [k, 3]])
        buf.add(torch.full((3, 1), float(k)), actions, np.full(3, k, np.float32), np.full((3, 1), k + 1.0),
                np.zeros(3, bool), np.zeros(3, bool), np.ones(3, bool))
    assert buf.actions.dtype == torch.float32 and len(buf) == 5
    assert buf.actions.tolist() == [[3, 2], [3, 3], [2, 2], [2, 3], [3, 1]]


def test_sum_tree_sums_and_prefix_search_match_numpy():
    rng = np.random.default_rng(0)
    tree = SumTree(13)
    priorities = np.zeros(13)
    for _ in range(20):
        idx = rng.integers(0, 13, size=4)
        values = rng.random(4)
        tree.update(idx, values)
        for i, v in zip(idx, values, strict=True):
            priorities[i] = v
        assert np.isclose(tree.total, priorities.sum())
        queries = rng.random(50) * priorities.sum()
        expected = np.searchsorted(np.cumsum(priorities), queries, side="right")
        np.testing.assert_array_equal(tree.find(queries), expected)


def test_sum_tree_sampling_frequencies_pass_a_chi_square_test():
    rng = np.random.default_rng(2)
    priorities = np.array([0.5, 3.0, 1.0, 0.0, 2.5, 1.0, 2.0])
    tree = SumTree(len(priorities))
    tree.update(np.arange(len(priorities)), priorities)
    tree.update(np.array([], dtype=np.int64), np.array([]))  # an empty update is a no-op
    draws = 70_000
    counts = np.bincount(tree.find(rng.random(draws) * tree.total), minlength=len(priorities))
    assert counts[3] == 0  # zero priority is never drawn
    expected = draws * priorities / priorities.sum()
    keep = expected > 0
    chi2 = (((counts[keep] - expected[keep]) ** 2) / expected[keep]).sum()
    assert chi2 < 22.46  # chi-square critical value, 6 degrees of freedom, p = 0.001


def test_prioritized_sampling_frequencies_and_importance_weights():
    torch.manual_seed(0)
    buf = PrioritizedReplayBuffer(4, 1, alpha=1.0, beta=0.5, beta_final=1.0, epsilon=1e-9, num_envs=1,
                                  obs_shape=(1,), action_shape=(), discrete=True, device=torch.device("cpu"),
                                  gamma=GAMMA)
    for k in range(4):
        buf.add(torch.tensor([[float(k)]]), torch.tensor([0]), np.array([0.0], np.float32), np.array([[0.0]]),
                np.array([False]), np.array([False]), np.array([True]))
    buf.update_priorities(torch.arange(4), torch.tensor([1.0, 2.0, 3.0, 4.0]))
    counts = np.zeros(4)
    for _ in range(500):
        batch = buf.sample(32)
        counts += np.bincount(batch.indices.numpy(), minlength=4)
    np.testing.assert_allclose(counts / counts.sum(), [0.1, 0.2, 0.3, 0.4], atol=0.01)
    batch = buf.sample(64)
    probs = (batch.indices.double() + 1) / 10
    expected = (4 * probs) ** -0.5
    torch.testing.assert_close(batch.weights.double(), expected / expected.max(), rtol=1e-5, atol=1e-6)
    # beta reaches beta_final at the end of training
    apply_schedules(build_schedules(NoAlgo(), None, storage=buf), 1.0)
    batch = buf.sample(64)
    expected = (4 * (batch.indices.double() + 1) / 10) ** -1.0
    torch.testing.assert_close(batch.weights.double(), expected / expected.max(), rtol=1e-5, atol=1e-6)


def test_new_transitions_get_the_maximum_priority():
    buf = PrioritizedReplayBuffer(8, 1, alpha=0.6, beta=0.4, beta_final=1.0, epsilon=1e-6, num_envs=1,
                                  obs_shape=(1,), action_shape=(), discrete=True, device=torch.device("cpu"),
                                  gamma=GAMMA)

    def add():
        buf.add(torch.zeros(1, 1), torch.tensor([0]), np.array([0.0], np.float32), np.array([[0.0]]),
                np.array([False]), np.array([False]), np.array([True]))

    add()
    buf.update_priorities(torch.tensor([0]), torch.tensor([5.0]))
    add()
    assert np.isclose(buf.tree.get(np.array([1]))[0], (5.0 + 1e-6) ** 0.6)


def test_sum_tree_prefix_matches_cumsum():
    rng = np.random.default_rng(1)
    tree = SumTree(11)
    p = rng.random(11)
    tree.update(np.arange(11), p)
    for i in range(12):
        assert np.isclose(tree.prefix(i), p[:i].sum())


def filled_ere(capacity: int, n_added: int, alpha: float = 0.0, c_min: int = 3) -> PrioritizedReplayBuffer:
    buf = PrioritizedReplayBuffer(capacity, 1, alpha=alpha, beta=0.4, beta_final=1.0, epsilon=1e-6, eta=0.5,
                                  eta_final=1.0, c_min=c_min, num_envs=1, obs_shape=(1,), action_shape=(),
                                  discrete=True, device=torch.device("cpu"), gamma=GAMMA)
    for k in range(n_added):
        buf.add(torch.tensor([[float(k)]]), torch.tensor([0]), np.array([0.0], np.float32), np.array([[0.0]]),
                np.array([False]), np.array([False]), np.array([True]))
    return buf


def test_ere_window_follows_the_formula_and_anneals_to_everything():
    buf = filled_ere(100, 100, c_min=3)
    # c_k = max(N * eta^(k * 1000 / K), c_min) with eta = 0.5 at progress 0
    assert buf.recent_window(step=0, steps=1000) == 100
    assert buf.recent_window(step=2, steps=1000) == 25
    assert buf.recent_window(step=10, steps=1000) == 3  # c_min
    apply_schedules(build_schedules(NoAlgo(), None, storage=buf), 1.0)
    assert buf.recent_window(step=10, steps=1000) == 100  # eta annealed to 1


@pytest.mark.parametrize(("capacity", "n_added"), [(50, 30), (20, 33)])  # not full; full and wrapped
def test_ere_samples_only_the_newest_transitions_uniformly(capacity, n_added):
    torch.manual_seed(0)
    buf = filled_ere(capacity, n_added, c_min=4)
    window = buf.recent_window(step=3, steps=1000)  # 0.5^3 * size, at least c_min
    newest = set(range(n_added - window, n_added))
    counts: dict[float, int] = {}
    for _ in range(400):
        batch = buf.sample(16, step=3, steps=1000)
        for value in batch.obs[:, 0].tolist():
            counts[value] = counts.get(value, 0) + 1
        torch.testing.assert_close(batch.weights, torch.ones(16))
    assert set(counts) == newest
    freq = np.array(list(counts.values())) / sum(counts.values())
    np.testing.assert_allclose(freq, 1 / window, atol=0.25 / window)


def test_storage_device_keeps_replay_on_the_gpu_only_while_it_fits():
    from rlcli.buffers.replay import storage_device

    cuda, cpu = torch.device("cuda:0"), torch.device("cpu")
    assert storage_device(cpu, 10**12) == cpu  # CPU training: always host memory
    assert storage_device(cuda, 10**9, free_bytes=4 * 10**9) == cuda  # fits: on the GPU
    assert storage_device(cuda, 10**10, free_bytes=4 * 10**9) == cpu  # would not fit: pinned host memory
    assert storage_device(cuda, 10**10, "device", free_bytes=4 * 10**9) == cuda  # forced
    assert storage_device(cuda, 10, "cpu", free_bytes=4 * 10**9) == cpu


def test_every_replay_storage_takes_priority_updates():
    """Algorithms call update_priorities after every gradient step, whatever the storage (a no-op unless per)."""
    import inspect
    import typing

    from rlcli.contracts import ReplayStorage
    from rlcli.registry import BUFFERS

    off_policy = [name for name in BUFFERS.names() if not BUFFERS.spec(name).on_policy]
    assert {"replay", "per", "her", "sequence"} <= set(off_policy)
    for name in off_policy:
        factory = BUFFERS._factories[name]  # a class, or a function that returns one (ere: a configured replay)
        factory = factory if isinstance(factory, type) else typing.get_type_hints(factory)["return"]
        for method in ("sample", "update_priorities"):
            assert callable(getattr(factory, method, None)), (name, method)
        params = list(inspect.signature(factory.update_priorities).parameters)
        assert params[1:] == list(inspect.signature(ReplayStorage.update_priorities).parameters)[1:], name


def test_a_loaded_buffers_pending_steps_come_back_on_its_storage_device():
    """A checkpoint read with map_location=cuda put the n-step buffer's unwritten steps on the GPU and a
    host-storage buffer's next write mixed devices (found on an H200). "meta" stands in for the GPU here."""
    buf = make(3)
    for t in range(2):  # two steps per env: pending, not yet written
        buf.add(torch.full((2, 1), float(t)), torch.zeros(2, dtype=torch.long), np.ones(2), np.ones((2, 1)),
                np.zeros(2), np.zeros(2), np.ones(2, dtype=bool))
    state = buf.state_dict()
    assert len(state["pending"][0]) == 2
    moved = pending_on(state["pending"], "meta")
    assert all(x.device.type == "meta" for steps in moved for step in steps for x in step[:2])
    assert [step[2] for step in moved[0]] == [step[2] for step in state["pending"][0]]  # floats as they were
    again = make(3)
    again.load_state_dict(state)
    assert all(x.device.type == "cpu" for steps in again.pending for step in steps for x in step[:2])


def test_a_ring_that_wraps_mid_write_keeps_the_newest_valid_transitions_in_slot_order():
    """Writes of several envs at once, reset steps skipped, across the ring's end (a slice or an index)."""
    num_envs, capacity = 3, 7
    buf = make(1, num_envs, capacity)
    trace = simulate(seed=4, num_envs=num_envs, steps=40)
    kept = []
    for obs, rewards, next_obs, terminated, done, valid in trace:
        buf.add(torch.as_tensor(obs).unsqueeze(-1), torch.zeros(num_envs, dtype=torch.long), rewards,
                next_obs[:, None], terminated, done, valid)
        kept += [(float(obs[i]), float(rewards[i]), float(next_obs[i])) for i in np.flatnonzero(valid)]
    assert len(buf) == capacity and len(kept) > 2 * capacity
    newest = kept[-capacity:]
    slots = [(buf.pos + j) % capacity for j in range(capacity)]  # oldest first
    got = [(float(buf.obs[k, 0]), float(buf.rewards[k]), float(buf.next_obs[k, 0])) for k in slots]
    assert got == newest
