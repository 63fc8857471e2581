"""env=vmas: VMAS's batched scenarios as rows (envs/vmas.py), on the layout env=pz shares (envs/multiagent.py)."""

import json
import shutil
import sys
from pathlib import Path

import forked_cli
import numpy as np
import pytest
import torch
from test_resume import assert_equal_state

pytest.importorskip("vmas")

import rlcli  # noqa: E402
from rlcli.envs.state import capturable, get_env_state, set_env_state  # noqa: E402
from rlcli.registry import ENVS, ConfigError  # noqa: E402
from rlcli.services import checkpoint  # noqa: E402
from rlcli.services.plain_state import decode, encode  # noqa: E402

QUIET = ["log.console=false", "deterministic=true", "train.stop_reward=null", "device=cpu", "torch_threads=1"]


def factory(**settings):
    return ENVS.build({"name": "vmas", "device": "cpu", **settings})


def recording(vec):
    """VMAS's own outputs of each step (and the observations after a reset step's resets), recorded."""
    seen = []
    step, get = vec.vmas.step, vec.vmas.get_from_scenario

    def record_step(actions):
        out = step(actions)
        seen.append({"obs": [o.clone() for o in out[0]], "rew": [r.clone() for r in out[1]], "done": out[2].clone()})
        return out

    def record_get(**kwargs):
        out = get(**kwargs)
        seen[-1]["obs"] = [o.clone() for o in out[0]]  # a reset step: the rows read these
        return out

    vec.vmas.step, vec.vmas.get_from_scenario = record_step, record_get
    return seen


# ----------------------------------------------------------------------------------------------- the adapter


def test_rows_are_vmas_tensors_with_one_hot_and_joint_observation_and_copies_reset_at_max_steps_or_when_done():
    vec = factory(scenario="balance", max_steps=4, critic_state=True).make(9)  # 3 copies of 3 agents
    assert vec.num_envs == 9 and vec.agent_names == ["agent_0", "agent_1", "agent_2"]
    own, n = vec.own_size, 3
    obs, _ = vec.reset(seed=0)
    assert obs.shape == (9, own + n + 3 * own) and vec.single_observation_space.policy_size == own + n
    calls = iter(range(100))  # VMAS asks the scenario once a step: copy 1 is done at the third step, no other
    vec.vmas.scenario.done = lambda: torch.tensor([False, next(calls) == 2, False])
    seen = recording(vec)
    rng = np.random.default_rng(0)
    returns, finished = np.zeros((3, n)), []
    for t in range(8):
        obs, rew, term, trunc, info = vec.step(rng.uniform(-1, 1, (9, 2)).astype(np.float32))
        raw = seen[-1]
        for c in range(3):
            for i in range(n):
                row = obs[c * n + i]
                assert np.array_equal(row[:own], raw["obs"][i][c].numpy())  # the agent's own VMAS observation
                assert np.array_equal(row[own:own + n], np.eye(n)[i])  # its one-hot
                assert np.array_equal(row[own + n:], torch.cat([o[c] for o in raw["obs"]]).numpy())  # everyone's
        rewards = np.stack([r.numpy() for r in raw["rew"]], axis=1)
        expected_term = {2: [1]}.get(t, [])
        expected_trunc = {3: [0, 2], 7: [1]}.get(t, [])
        reset = {3: [1], 4: [0, 2]}.get(t, [])  # the step after an episode's end
        for c in range(3):
            flags = term[c * n:(c + 1) * n], trunc[c * n:(c + 1) * n]
            assert flags[0].tolist() == [c in expected_term] * n and flags[1].tolist() == [c in expected_trunc] * n
            if c in reset:
                assert not rew[c * n:(c + 1) * n].any() and vec.vmas.steps[c] == 0  # reset by VMAS's reset_at
            else:
                assert np.array_equal(rew[c * n:(c + 1) * n], rewards[c].astype(np.float64))
                returns[c] += rewards[c]
        if "_episode" in info:
            rows = np.flatnonzero(info["_episode"])
            for row in rows:
                c = row // n
                assert info["episode"]["r"][row] == pytest.approx(returns[c].sum())  # the team sum, never divided
                assert info["agent_episode"]["r"][row:row + n] == pytest.approx(returns[c])
                assert info["episode"]["l"][row] == (3 if c == 1 and t == 2 else 4)
                finished.append((t, int(c)))
                returns[c] = 0
    assert finished == [(2, 1), (3, 0), (3, 2), (7, 1)]
    vec.close()


def test_joint_rows_hold_each_copys_agents_and_a_done_copy_is_terminated_with_no_agent_active():
    vec = factory(scenario="navigation", kwargs={"n_agents": 2}, max_steps=3, joint=True,
                  continuous_actions=False).make(2)
    assert vec.num_envs == 2 and vec.single_observation_space.shape[:1] == (2,)
    space = vec.single_action_space
    assert type(space).__name__ == "JointActions" and space.n_agents == 2
    obs, _ = vec.reset(seed=1)
    own = vec.own_size
    calls = iter(range(100))
    vec.vmas.scenario.done = lambda: torch.tensor([next(calls) == 1, False])
    seen = recording(vec)
    for t in range(3):
        obs, rew, term, trunc, info = vec.step(np.ones((2, 2), np.int64))
        raw = seen[-1]
        for c in range(2):
            for i in range(2):
                assert np.array_equal(obs[c, i, :own], raw["obs"][i][c].numpy())
                assert np.array_equal(obs[c, i, own + 2 + 1:], torch.cat([o[c] for o in raw["obs"]]).numpy())
        assert rew[1] == pytest.approx(sum(float(r[1]) for r in raw["rew"]))  # the team reward
        active = obs[:, :, own + 2]
        if t == 1:  # copy 0 done by VMAS: terminated, its agents inactive; copy 1 goes on
            assert term.tolist() == [True, False] and not trunc.any() and active.tolist() == [[0, 0], [1, 1]]
        elif t == 2:  # copy 1 at max_steps: truncated (its agents stay active: the value bootstraps)
            assert trunc.tolist() == [False, True] and not term.any() and active.tolist() == [[1, 1], [1, 1]]
            assert info["episode"]["l"][1] == 3 and rew[0] == 0
    vec.close()


def test_the_world_and_its_random_state_are_saved_and_restored_exactly():
    f = factory(scenario="transport", max_steps=5)
    a, b = f.make(12), f.make(12)  # 3 copies of 4 agents
    assert capturable(a)
    a.reset(seed=3)
    rng = np.random.default_rng(1)
    actions = [rng.uniform(-1, 1, (12, 2)).astype(np.float32) for _ in range(20)]
    for k in range(7):
        a.step(actions[k])
    state = decode(encode(get_env_state(a), objects=True))  # as a checkpoint holds it
    b.reset(seed=99)
    set_env_state(b, state)
    for k in range(7, 20):  # across resets: the same new episodes
        for x, y in zip(a.step(actions[k])[:4], b.step(actions[k])[:4], strict=True):
            assert np.array_equal(x, y)


@pytest.mark.parametrize(("settings", "message"), [
    ({"scenario": "balanse"}, "env.scenario='balanse' is not a VMAS scenario (did you mean balance?); choose from: "),
    ({"scenario": None}, "env.scenario=None is not a VMAS scenario"),
    # VMAS's own time limit comes back as done, which would end episodes as terminated: env.max_steps truncates
    ({"scenario": "navigation", "kwargs": {"max_steps": 3}}, "env.kwargs.max_steps: max_steps is a setting of VMAS's "
                                                             "make_env, not of the scenario; use env.max_steps"),
    ({"scenario": "navigation", "kwargs": {"terminated_truncated": True}}, "env.kwargs.terminated_truncated: "
                                                                           "terminated_truncated is a setting of"),
    ({"scenario": "balance", "kwargs": {"n_agent": 4}}, "env.kwargs={'n_agent': 4}: VMAS says Scenario kwargs: "
                                                         "{'n_agent': 4} passed but not used by the scenario."),
    ({"scenario": "balance", "max_steps": 0}, "env.max_steps"),
    ({"scenario": "balance", "agents": ["agent_7"]}, "env.agents: 'agent_7' is not an agent of vmas/balance"),
    ({"scenario": "balance", "device": "cuda:x"}, "env.device (where VMAS simulates): device='cuda:x' is invalid"),
])
def test_bad_vmas_configs_are_one_line(settings, message):
    with pytest.raises(ConfigError) as error:
        factory(**settings)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_without_vmas_and_with_rows_that_split_no_copy_the_errors_are_one_line(monkeypatch):
    with pytest.raises(ConfigError, match=r"train.num_envs=8: env vmas/balance has 3 agents, one row each, so "
                                          r"train.num_envs must be a multiple of 3 \(e.g. 6 = 2 copies of the env\)"):
        factory(scenario="balance").make(8)
    monkeypatch.setitem(sys.modules, "vmas", None)  # import vmas raises ImportError
    with pytest.raises(ConfigError) as error:
        factory(scenario="balance")
    assert str(error.value).startswith("env=vmas needs VMAS: pip install -e '.[vmas]'") and "\n" not in str(error.value)


# ------------------------------------------------------------------------------------------ runs of rl-train


def final(run_dir: Path) -> dict:
    return checkpoint.load(next(iter(checkpoint.candidates(run_dir / "checkpoints"))))


def train(args: list[str], run_dir: Path) -> None:
    done = forked_cli.run([*args, *QUIET, f"hydra.run.dir={run_dir}"], run_dir.parent)
    assert done.returncode == 0, done.stderr


def test_mappo_on_balance_trains_evaluates_and_resumes_mid_episode_bit_identically(tmp_path):
    """Rows of 4 copies, 20-step episodes; checkpoints every 240 env steps (20 VMAS steps): the copy resumed from the
    one at 480 goes on from its copies' mid-episode world state to the same weights, buffer and scalars."""
    args = ["algo=mappo", "env=vmas", "env.scenario=balance", "env.max_steps=30", "train.num_envs=12",
            "algo.n_steps=20", "algo.batch_size=120", "algo.n_epochs=2", "train.total_steps=960",
            "train.checkpoint_every=240", "train.test_every=480", "train.test_episodes=2"]
    run_dir = tmp_path / "straight"
    train(args, run_dir)
    record = json.loads((run_dir / "eval.jsonl").read_text().splitlines()[-1])
    agents = record["agent_returns"]
    assert list(agents) == ["agent_0", "agent_1", "agent_2"]
    assert record["returns"] == pytest.approx([sum(r) for r in zip(*agents.values(), strict=True)])  # never divided
    out = forked_cli.run([str(run_dir), "episodes=2"], tmp_path, program="rl-eval")
    assert out.returncode == 0, out.stderr
    assert "vmas/balance" in out.stdout
    policy = rlcli.load(run_dir)  # predict on a dict of VMAS's observations: each agent's row's action
    envs = policy.make_env(1)
    rows, _ = envs.reset(seed=0)
    vec = envs
    while not hasattr(vec, "vmas"):
        vec = vec.env
    raw = vec._call(vec.vmas.get_from_scenario, get_observations=True, get_rewards=False, get_infos=False,
                    get_dones=False)[0]
    actions, _ = policy.predict({f"agent_{i}": raw[i][0].numpy() for i in range(3)}, deterministic=True)
    expected, _ = policy.predict(rows, deterministic=True)
    for i in range(3):
        np.testing.assert_allclose(actions[f"agent_{i}"], expected[i], rtol=1e-6)
    envs.close()
    copy = tmp_path / "resumed"
    shutil.copytree(run_dir, copy)
    for late in ("ckpt_000000000720.pt", "ckpt_000000000960.pt"):
        (copy / "checkpoints" / late).unlink()
    done = forked_cli.run([*QUIET, f"resume={copy / 'checkpoints' / 'ckpt_000000000480.pt'}"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "resumed at 480 env steps" in (copy / "train.log").read_text()
    a, b = final(run_dir), final(copy)
    assert b["state"]["env_steps"] == 960
    assert_equal_state(a["algo"], b["algo"], "algo")
    assert_equal_state(a["buffer"], b["buffer"], "buffer")


def test_masac_in_joint_mode_runs_on_a_vmas_scenario(tmp_path):
    run_dir = tmp_path / "masac"
    train(["algo=masac", "env=vmas", "env.scenario=navigation", "+env.kwargs.n_agents=2", "env.max_steps=10",
           "train.num_envs=4", "train.total_steps=160", "algo.learning_starts=80", "algo.batch_size=32",
           "actor.hidden_sizes=[32,32]", "train.test_every=160", "train.test_episodes=2"], run_dir)
    record = json.loads((run_dir / "eval.jsonl").read_text().splitlines()[-1])
    assert record["lengths"] == [10, 10] and list(record["agent_returns"]) == ["agent_0", "agent_1"]
