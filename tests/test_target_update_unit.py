"""The DQN family's `algo.target_update_unit`: env_step (SB3's rule, the default: the target network at the end of the
update phase whose env steps cross a multiple of the interval) or gradient_step (after every interval-th gradient step,
inside the step: BenchMARL's and torchrl's soft update with interval 1). Against plain references written here, for a
single run and for a population's members, and the one-line error of a unit that does not exist. QMIX's
`algo.hypernet_layers=1` (torchrl's QMixer: one linear layer per mixing weights' hypernetwork) against a hand-written
mix. Exact resume with both settings: tests/test_multiagent_joint.py."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import run_cli
from test_population_offpolicy import TINY, assert_first_update_is_each_single_runs

from rlcli.actors.mixers import QMixer
from rlcli.actors.normalizer import RunningNorm
from rlcli.actors.offpolicy import NetworkRecipe
from rlcli.algos.dqn import DQN
from rlcli.batches import ReplayBatch
from rlcli.contracts import RunClock
from rlcli.run.algo_defaults import algo_defaults
from rlcli.run.compose import compose_config
from rlcli.run.state import prepare

TAU = 0.3


class OneBatch:
    """A storage whose every sample is one fixed batch (contracts.ReplayStorage, uniform)."""

    def __init__(self, batch):
        self.batch = batch

    def sample(self, *args):
        return self.batch

    def update_priorities(self, indices, td_errors):
        pass

    def __len__(self):
        return len(self.batch.rewards)


def fixed_batch():
    g = torch.Generator().manual_seed(3)
    return ReplayBatch(torch.randn(8, 3, generator=g), torch.randint(0, 4, (8,), generator=g),
                       torch.randn(8, generator=g), torch.randn(8, 3, generator=g), torch.tensor([0.99, 0.0] * 4),
                       torch.ones(8), torch.arange(8))


def tiny_dqn(**settings):
    torch.manual_seed(0)
    recipe = NetworkRecipe(3, [16], "relu", False, RunningNorm((3,), enabled=False))
    return DQN(recipe, gym.spaces.Discrete(4), num_envs=1, lr=1e-2, batch_size=8, learning_starts=0,
               max_grad_norm=None, **settings)


def weights(module):
    return [p.detach().clone() for p in module.parameters()]


def lerp(target, source, tau):
    """target <- (1 - tau) target + tau source, by hand."""
    return [(1 - tau) * t + tau * s for t, s in zip(target, source, strict=True)]


def assert_weights(module, expected):
    for p, e in zip(module.parameters(), expected, strict=True):
        torch.testing.assert_close(p.detach(), e, rtol=1e-6, atol=1e-7)


def test_the_gradient_step_unit_polyak_updates_the_target_after_every_nth_gradient_step():
    """Interval 2, one gradient step a phase: the target moves toward the online network after steps 2 and 4 only,
    whatever the env steps (which cross a multiple of 2 at every phase: the env-step rule would update each time)."""
    algo = tiny_dqn(tau=TAU, target_update_interval=2, target_update_unit="gradient_step")
    batch, net = fixed_batch(), algo.networks
    expected = weights(net.q_target)
    assert all(torch.equal(t, s) for t, s in zip(expected, weights(net.q), strict=True))  # a copy at the start
    for k in range(1, 6):
        algo.update(OneBatch(batch), RunClock(k * 400, 2000))
        if k % 2 == 0:
            expected = lerp(expected, weights(net.q), TAU)
        assert_weights(net.q_target, expected)
    assert algo.gradient_updates == 5 and algo.last_target_update == 0  # the env-step rule never ran


def test_the_gradient_step_unit_updates_inside_the_phase_not_at_its_end():
    """Three gradient steps in one phase with interval 2 and a hard copy (tau 1): the target is the online network
    after step 2 (a twin that took only those 2 steps), not after step 3."""
    algo = tiny_dqn(tau=1.0, target_update_interval=2, target_update_unit="gradient_step", gradient_steps=3)
    twin = tiny_dqn(tau=1.0, target_update_interval=2, target_update_unit="gradient_step", gradient_steps=2)
    batch = fixed_batch()
    algo.update(OneBatch(batch), RunClock(100, 1000))
    twin.update(OneBatch(batch), RunClock(100, 1000))
    assert_weights(algo.networks.q_target, weights(twin.networks.q))
    assert not torch.equal(next(algo.networks.q.parameters()), next(twin.networks.q.parameters()))  # step 3 moved on


def test_the_default_unit_is_env_steps_at_the_end_of_an_update_phase():
    """The default (every existing config's) is SB3's rule as it was: at the end of a phase whose env steps cross a
    multiple of the interval, whatever the gradient steps; it is the constructor's default for every DQN of the
    family, so the composed yaml defaults say env_step too."""
    algo = tiny_dqn(tau=TAU, target_update_interval=150, gradient_steps=2)
    assert algo.target_update_unit == "env_step"
    for name in ("dqn", "qrdqn", "c51", "discrete_cql", "vdn", "qmix"):
        assert algo_defaults()[name]["target_update_unit"] == "env_step", name
    batch, net = fixed_batch(), algo.networks
    expected = weights(net.q_target)
    for env_steps, due in ((100, False), (200, True), (250, False), (299, False), (300, True)):
        algo.update(OneBatch(batch), RunClock(env_steps, 1000))
        if due:
            expected = lerp(expected, weights(net.q), TAU)
        assert_weights(net.q_target, expected)
    assert algo.gradient_updates == 10 and algo.last_target_update == 300


def test_a_populations_members_update_their_targets_by_their_own_gradient_step_intervals():
    """Members batched in one lockstep population: each member's target after its first update phase (2 gradient
    steps) is its single run's, with interval 1 (both steps) for two of them and 2 (the second step) for another."""
    unit = ["algo=dqn", "algo.target_update_unit=gradient_step", "algo.tau=0.5", "algo.target_update_interval=1"]
    members = []
    for more in (["seed=0"], ["seed=1", "algo.lr=1e-3"], ["seed=2", "algo.target_update_interval=2"]):
        components, _ = prepare(compose_config([*TINY, *unit, *more]))
        for _ in range(8):
            components.collector.collect(components.learner, random_actions=True)
        members.append((components, torch.get_rng_state()))
    before = [weights(c.algo.networks.q_target) for c, _ in members]
    clock = RunClock(128, 1024, 16)
    assert_first_update_is_each_single_runs(members, [clock, clock, clock])
    for (components, _), start in zip(members, before, strict=True):
        assert components.algo.gradient_updates == 2
        assert not torch.equal(next(components.algo.networks.q_target.parameters()), start[0])  # it moved


@pytest.mark.parametrize(("args", "expected"), [
    (["algo=dqn", "env=CartPole-v1", "algo.target_update_unit=episode"],
     "algo.target_update_unit='episode' is invalid: choose from: env_step, gradient_step"),
    (["algo=qmix", "env=coop_match", "algo.hypernet_layers=3"],
     "algo.hypernet_layers=3 is invalid: choose from: 1, 2"),
])
def test_a_bad_unit_or_hypernet_depth_is_one_line_naming_the_choices(args, expected, tmp_path):
    out = run_cli(*args, "hydra.run.dir=run", cwd=tmp_path)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1 and expected in lines[0], out.stderr
    assert "Traceback" not in out.stderr


def test_one_hypernet_layer_mixes_as_torchrls_qmixer():
    """hypernet_layers=1: each mixing weights' hypernetwork is one linear layer of the state (torchrl's QMixer:
    hyper_w_1, hyper_w_final, hyper_b_1 and V of two layers), mixed as written here; still monotonic."""
    torch.manual_seed(0)
    n_agents, state_size, embed = 3, 54, 32
    mixer = QMixer(n_agents, state_size, embed, hypernet_layers=1)
    assert isinstance(mixer.hyper_w1, torch.nn.Linear) and isinstance(mixer.hyper_w2, torch.nn.Linear)
    torchrl_sizes = (state_size * embed * n_agents + embed * n_agents + 3 * (state_size * embed + embed)
                     + embed + 1)  # hyper_w_1, hyper_w_final, hyper_b_1, V's first layer; V's last
    assert sum(p.numel() for p in mixer.parameters()) == torchrl_sizes

    def lin(layer, x):
        return layer.weight.detach().numpy() @ x + layer.bias.detach().numpy()

    g = torch.Generator().manual_seed(1)
    qs, states = 5 * torch.randn(6, n_agents, generator=g), torch.randn(6, state_size, generator=g)
    out = mixer(qs, states)
    expected = []
    for q, s in zip(qs.numpy(), states.numpy(), strict=True):
        pre = q @ np.abs(lin(mixer.hyper_w1, s)).reshape(n_agents, embed) + lin(mixer.hyper_b1, s)
        hidden = np.where(pre > 0, pre, np.expm1(pre))  # elu
        value = lin(mixer.value[2], np.maximum(lin(mixer.value[0], s), 0.0))[0]
        expected.append(float(hidden @ np.abs(lin(mixer.hyper_w2, s)) + value))
    np.testing.assert_allclose(out.detach().numpy(), expected, rtol=1e-5, atol=1e-5)
    qs.requires_grad_(True)
    mixer(qs, states).sum().backward()
    assert qs.grad is not None and (qs.grad >= 0).all()


def test_two_hypernet_layers_build_the_same_mixer_as_before():
    """The default (hypernet_layers=2) draws the same weights, in the same order and under the same names, as the mixer
    built before the setting (written out here as it was: each weights' hypernetwork Linear-ReLU-Linear)."""
    nn = torch.nn
    torch.manual_seed(0)
    mixer = QMixer(3, 5, 8, 16)
    torch.manual_seed(0)
    old = nn.Module()
    old.hyper_w1 = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3 * 8))
    old.hyper_b1 = nn.Linear(5, 8)
    old.hyper_w2 = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 8))
    old.value = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 1))
    mine, theirs = mixer.state_dict(), old.state_dict()
    assert list(mine) == list(theirs) and all(torch.equal(mine[k], theirs[k]) for k in mine)
