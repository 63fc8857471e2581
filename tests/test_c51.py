"""C51: the categorical projection and the loss against plain references written out atom by atom, its
one-line refusals, its population members, and a short learning run."""

import json

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import run_cli
from test_population_offpolicy import TINY, assert_first_update_is_each_single_runs

from rlcli.actors.normalizer import RunningNorm
from rlcli.actors.offpolicy import NetworkRecipe
from rlcli.algos.c51 import C51, categorical_projection
from rlcli.batches import ReplayBatch
from rlcli.contracts import RunClock
from rlcli.run.compose import compose_config
from rlcli.run.state import prepare


def reference_projection(probs: np.ndarray, targets: np.ndarray, atoms: np.ndarray) -> np.ndarray:
    """Bellemare et al.'s Algorithm 1, one target at a time: clip Tz to [v_min, v_max], b = (Tz - v_min) / dz,
    mass p (u - b) to atom l = floor(b) and p (b - l) to u = ceil(b); all of it to l when b lands on an atom."""
    dz = atoms[1] - atoms[0]
    out = np.zeros_like(probs)
    for row in range(probs.shape[0]):
        for p, tz in zip(probs[row], targets[row], strict=True):
            b = (min(max(tz, atoms[0]), atoms[-1]) - atoms[0]) / dz
            low, high = int(np.floor(b)), int(np.ceil(b))
            if low == high:
                out[row, low] += p
            else:
                out[row, low] += p * (high - b)
                out[row, high] += p * (b - low)
    return out


def test_the_projection_is_the_papers_algorithm():
    rng = np.random.default_rng(0)
    atoms = np.linspace(-10.0, 10.0, 11)
    probs = rng.dirichlet(np.ones(11), size=6)
    targets = rng.uniform(-14.0, 14.0, size=(6, 11))  # beyond both ends, to be clipped
    targets[0] = atoms  # exactly on the atoms: the mass stays where it is
    targets[1, :3] = [-10.0, 10.0, 0.0]
    got = categorical_projection(torch.tensor(probs), torch.tensor(targets), torch.tensor(atoms)).numpy()
    np.testing.assert_allclose(got, reference_projection(probs, targets, atoms), rtol=0, atol=1e-12)
    np.testing.assert_allclose(got[0], probs[0], atol=1e-12)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-12)  # no mass lost at the clipped ends


def tiny_c51(**settings) -> C51:
    recipe = NetworkRecipe(obs_dim=3, hidden_sizes=[8], activation="tanh", ortho_init=False,
                           normalizer=RunningNorm((3,), enabled=False))
    return C51(recipe, gym.spaces.Discrete(2), num_envs=1, n_atoms=5, v_min=-2.0, v_max=2.0, **settings)


def reference_loss(algo: C51, batch: ReplayBatch, double: bool) -> torch.Tensor:
    """The loss transition by transition: the next action greedy by mean return (picked by the online net when
    double), its target distribution projected with the reference projection, then cross-entropy."""
    atoms = algo.atoms.double().numpy()
    losses = []
    for i in range(batch.obs.shape[0]):
        with torch.no_grad():
            next_target = torch.softmax(algo.networks.q_target(batch.next_obs[i:i + 1]).view(2, 5).double(), -1)
            next_online = torch.softmax(algo.networks.q(batch.next_obs[i:i + 1]).view(2, 5).double(), -1)
        picker = next_online if double else next_target
        best = int(np.argmax([(picker[a].numpy() * atoms).sum() for a in range(2)]))
        shifted = float(batch.rewards[i]) + float(batch.discounts[i]) * atoms
        target = reference_projection(next_target[best].numpy()[None], shifted[None], atoms)[0]
        logits = algo.networks.q(batch.obs[i:i + 1]).view(2, 5)[int(batch.actions[i])].double()
        losses.append(-(torch.tensor(target) * torch.log_softmax(logits, -1)).sum() * float(batch.weights[i]))
    return torch.stack(losses).mean()


@pytest.mark.parametrize("double", [False, True])
def test_the_loss_is_cross_entropy_to_the_projected_target(double):
    torch.manual_seed(0)
    algo = tiny_c51(double=double)
    for p in algo.networks.q_target.parameters():  # a target network that differs from the online one
        p.data.add_(0.3 * torch.randn_like(p))
    n = 6
    batch = ReplayBatch(obs=torch.randn(n, 3), actions=torch.tensor([0, 1, 1, 0, 1, 0]),
                        rewards=torch.tensor([0.5, -1.0, 3.0, 0.0, 1.5, -0.2]), next_obs=torch.randn(n, 3),
                        discounts=torch.tensor([0.99, 0.99, 0.0, 0.99, 0.9801, 0.0]),
                        weights=torch.tensor([1.0, 0.5, 1.0, 2.0, 1.0, 1.0]), indices=torch.arange(n))
    loss, (priorities, q_mean) = algo.transition_loss(batch)
    assert float(loss) == pytest.approx(float(reference_loss(algo, batch, double)), rel=1e-5)
    assert priorities.shape == (n,) and bool((priorities > 0).all())  # cross-entropies: PER's priorities
    expected_q = (torch.softmax(algo.networks.q(batch.obs).view(n, 2, 5), -1) * algo.atoms).sum(-1)
    assert float(q_mean) == pytest.approx(float(expected_q[torch.arange(n), batch.actions].mean()), rel=1e-5)


def test_acting_is_greedy_in_the_mean_return():
    torch.manual_seed(1)
    algo = tiny_c51()
    obs = torch.randn(16, 3)
    means = (torch.softmax(algo.networks.q(obs).view(16, 2, 5), -1) * algo.atoms).sum(-1)
    assert torch.equal(algo.act(obs, deterministic=True).actions, means.argmax(-1))


@pytest.mark.parametrize(("args", "expected"), [
    (["algo.n_atoms=1"], "algo.n_atoms=1 is invalid: must be >= 2"),
    (["algo.v_min=5", "algo.v_max=4"], "algo.v_min=5 is invalid: must be below algo.v_max=4"),
    (["algo.dueling=true"], "algo.dueling=true is invalid: is not built for C51's distributions"),
    (["algo.loss=mse"], "algo.loss='mse' is invalid: C51 always learns by cross-entropy"),
    (["actor=gru"], "actor=gru"),
])
def test_bad_settings_are_one_line(args, expected, tmp_path):
    out = run_cli("algo=c51", "env=CartPole-v1", *args, "hydra.run.dir=run", cwd=tmp_path)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1 and expected in lines[0], out.stderr
    assert "Traceback" not in out.stderr


def test_population_members_take_their_single_runs_first_update():
    """C51 is a DQN: its members batch through the same value-based population update, no code of its own. (The
    atoms are not among the values a population batches: jobs that differ in them form separate populations.)"""
    members = []
    for more in (["seed=0"], ["seed=1", "algo.lr=1e-3", "algo.max_grad_norm=0.5"], ["seed=2", "algo.gamma=0.9"]):
        components, _ = prepare(compose_config([*TINY, "algo=c51", "algo.n_atoms=11", *more]))
        for _ in range(8):
            components.collector.collect(components.learner, random_actions=True)
        members.append((components, torch.get_rng_state()))
    clock = RunClock(128, 1024, 16)
    assert_first_update_is_each_single_runs(members, [clock, clock, clock])


@pytest.mark.slow
def test_c51_learns_cartpole(tmp_path):
    """RL-Zoo's QR-DQN CartPole recipe (256 env steps, then 128 gradient steps; [256, 256]) with 51 atoms over
    [0, 100] (CartPole's discounted returns lie in it): seed 0 tested 500 at 30,208 env steps when measured.
    CleanRL's own CartPole settings (conf/tuned/c51/CartPole-v1.yaml) take 500k steps, too long for CI."""
    out = run_cli("algo=c51", "env=CartPole-v1", "seed=0", "train.total_steps=40960", "actor.hidden_sizes=[256,256]",
                  "buffer.capacity=100000", "algo.v_min=0", "algo.v_max=100", "algo.n_atoms=51", "algo.lr=2.3e-3",
                  "algo.batch_size=64", "algo.learning_starts=1000", "algo.target_update_interval=10",
                  "algo.train_freq=256", "algo.gradient_steps=128", "algo.exploration_fraction=0.16",
                  "algo.exploration_final_eps=0.04", "log.console=false", f"hydra.run.dir={tmp_path / 'run'}",
                  cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    phases = [json.loads(line) for line in (tmp_path / "run" / "eval.jsonl").read_text().splitlines()]
    assert max(sum(p["returns"]) / len(p["returns"]) for p in phases) >= 475
