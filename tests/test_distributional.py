"""Quantile critics (TQC) and quantile Q-networks (QR-DQN): the quantile Huber loss, TQC's truncated
target and each algorithm's loss, against plain references written out element by element."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import run_cli

from rlcli.actors.normalizer import RunningNorm
from rlcli.actors.offpolicy import NetworkRecipe
from rlcli.algos.losses import quantile_huber_loss
from rlcli.algos.qrdqn import QRDQN
from rlcli.algos.tqc import TQC, truncated_targets


def reference_quantile_huber(quantiles: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """quantiles [N, B, Q], targets [B, T] -> [B]: sum over i of mean over (critic, j) of
    |tau_i - 1{u < 0}| * huber(u), u = target_j - quantile_i, tau_i = (i + 0.5) / Q."""
    n_critics, batch, n = quantiles.shape
    out = np.zeros(batch)
    for b in range(batch):
        total = 0.0
        for c in range(n_critics):
            for i in range(n):
                tau = (i + 0.5) / n
                for t in targets[b]:
                    u = t - quantiles[c, b, i]
                    huber = 0.5 * u * u if abs(u) <= 1 else abs(u) - 0.5
                    total += abs(tau - (1.0 if u < 0 else 0.0)) * huber / targets.shape[1]
        out[b] = total / n_critics
    return out


def test_quantile_huber_loss_matches_the_definition():
    rng = np.random.default_rng(0)
    quantiles = rng.normal(size=(2, 3, 4)) * 2  # errors on both sides of the Huber kink
    targets = rng.normal(size=(3, 6)) * 2
    got = quantile_huber_loss(torch.tensor(quantiles), torch.tensor(targets)).numpy()
    np.testing.assert_allclose(got, reference_quantile_huber(quantiles, targets), rtol=1e-12)


def test_quantile_huber_loss_is_minimized_near_the_true_quantiles():
    """Each q_i's loss is minimized at the tau_i-quantile of the targets, up to the Huber region's width
    (kappa = 1): here targets are 1,001 evenly spread samples of U(0, 100)."""
    targets = torch.linspace(0, 100, 1001, dtype=torch.float64).expand(1, -1)
    candidates = torch.linspace(0, 100, 2001, dtype=torch.float64)
    for i, tau in enumerate([0.125, 0.375, 0.625, 0.875]):
        # the loss is a sum of independent terms per quantile: vary q_i alone, the others fixed
        losses = []
        for c in candidates:
            q = torch.tensor([12.5, 37.5, 62.5, 87.5], dtype=torch.float64)
            q[i] = c
            losses.append(quantile_huber_loss(q.view(1, 1, 4), targets).item())
        best = candidates[int(np.argmin(losses))].item()
        assert abs(best - 100 * tau) < 1.0, (tau, best)


def test_truncated_targets_pool_sort_and_drop_the_largest():
    next_quantiles = torch.tensor([[[5.0, 1.0, 3.0]], [[2.0, 6.0, 4.0]]])  # [N=2, B=1, Q=3]
    assert truncated_targets(next_quantiles, 1).tolist() == [[1.0, 2.0, 3.0, 4.0]]  # drops 1 x 2 critics
    assert truncated_targets(next_quantiles, 0).tolist() == [[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]]


def test_tqc_critic_loss_against_a_plain_computation():
    torch.manual_seed(0)
    recipe = NetworkRecipe(obs_dim=3, hidden_sizes=[16], activation="relu", ortho_init=False,
                           normalizer=RunningNorm((3,), enabled=False))
    algo = TQC(recipe, gym.spaces.Box(-1, 1, (2,)), num_envs=1, batch_size=4, learning_starts=4, n_quantiles=5,
               top_quantiles_to_drop_per_net=2, num_critics=3, ent_coef=0.2, gamma=0.9)

    class Batch:
        obs, next_obs = torch.randn(4, 3), torch.randn(4, 3)
        actions = torch.rand(4, 2) * 2 - 1
        rewards = torch.randn(4)
        discounts = torch.tensor([0.9, 0.9, 0.0, 0.9])  # a terminal transition keeps only its reward
        weights = torch.ones(4)

    next_actions, next_log_probs = torch.rand(4, 2) * 2 - 1, torch.randn(4)
    loss, errors = algo.critic_loss(Batch, next_actions, next_log_probs, torch.tensor(0.2))
    # plain: every target critic's 5 quantiles, pooled (15), sorted, the top 2 x 3 dropped -> 9
    with torch.no_grad():
        per_critic = [net(Batch.next_obs, next_actions) for net in algo.networks.critics_target.nets]
        pooled = torch.cat(per_critic, -1).sort(-1).values[:, :9]
        target = Batch.rewards[:, None] + Batch.discounts[:, None] * (pooled - 0.2 * next_log_probs[:, None])
        current = torch.stack([net(Batch.obs, Batch.actions) for net in algo.networks.critics.nets])
    expected = reference_quantile_huber(current.double().numpy(), target.double().numpy()).mean()
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert errors.shape == (4,)


def test_qrdqn_loss_against_a_plain_computation():
    torch.manual_seed(0)
    recipe = NetworkRecipe(obs_dim=3, hidden_sizes=[16], activation="relu", ortho_init=False,
                           normalizer=RunningNorm((3,), enabled=False))
    algo = QRDQN(recipe, gym.spaces.Discrete(3), num_envs=1, batch_size=4, learning_starts=4, n_quantiles=6)
    with torch.no_grad():  # a target network that differs from the online one
        for p in algo.networks.q_target.parameters():
            p.add_(0.1 * torch.randn_like(p))

    class Batch:
        obs, next_obs = torch.randn(4, 3), torch.randn(4, 3)
        actions = torch.tensor([0, 2, 1, 2])
        rewards = torch.randn(4)
        discounts = torch.tensor([0.99, 0.0, 0.99, 0.99])
        weights = torch.tensor([1.0, 0.5, 2.0, 1.0])  # PER importance weights scale each sample

    loss, (errors, _) = algo.transition_loss(Batch)
    with torch.no_grad():
        expected = []
        for b in range(4):
            nq = algo.networks.q_target(Batch.next_obs[b:b + 1]).view(3, 6)  # [actions, quantiles]
            greedy = int(nq.mean(-1).argmax())
            target = Batch.rewards[b] + Batch.discounts[b] * nq[greedy]
            current = algo.networks.q(Batch.obs[b:b + 1]).view(3, 6)[Batch.actions[b]]
            ref = reference_quantile_huber(current.double().numpy()[None, None], target.double().numpy()[None])[0]
            expected.append(Batch.weights[b].item() * ref)
        # acting picks the action with the highest mean quantile
        obs = torch.randn(5, 3)
        means = algo.networks.q(obs).view(5, 3, 6).mean(-1)
        assert torch.equal(algo.act(obs, deterministic=True).actions, means.argmax(-1))
    assert loss.item() == pytest.approx(float(np.mean(expected)), rel=1e-5)
    assert errors.shape == (4,)


@pytest.mark.slow
def test_qrdqn_learns_cartpole(tmp_path):
    """RL-Zoo's tuned QR-DQN CartPole config (50k steps), tested every 2,500 steps so that the run stops soon after
    it reaches 475. Measured 2026-11-27, seeds 0-3 reached 500 at 27,648, 15,104, 5,120 and 37,632 env steps
    (seed 1: 22 s here against 80 s for seed 0 tested every 10k); seed 2 looks lucky, so seed 1. On another CPU
    the run may take another path (rounding), and has the whole 50k budget to learn."""
    out = run_cli("algo=qrdqn", "env=CartPole-v1", "seed=1", "train.test_every=2500", "log.console=false",
                  f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    import json

    phases = [json.loads(line) for line in (tmp_path / "run" / "eval.jsonl").read_text().splitlines()]
    assert max(sum(p["returns"]) / len(p["returns"]) for p in phases) >= 475


@pytest.mark.slow
def test_tqc_learns_pendulum(tmp_path):
    """RL-Zoo's TQC Pendulum settings (64 gradient steps per 64 env steps, [64, 64] networks) with 10
    quantiles per critic, the largest 1 per critic dropped (RL-Zoo: 25 and 2; 10 makes the pairwise loss
    ~6x cheaper). Seeds 0 and 1 were at -349 and -196 after 4,032 steps."""
    out = run_cli("algo=tqc", "env=Pendulum-v1", "seed=1", "algo.n_quantiles=10",
                  "algo.top_quantiles_to_drop_per_net=1", "train.total_steps=4000", "train.test_every=4000",
                  "train.test_episodes=5", "train.stop_reward=null", "log.console=false",
                  f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    import json

    phases = [json.loads(line) for line in (tmp_path / "run" / "eval.jsonl").read_text().splitlines()]
    final = sum(phases[-1]["returns"]) / len(phases[-1]["returns"])
    assert final > -400, final  # random play is about -1200 to -1500
