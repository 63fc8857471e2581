"""Off-policy numeric pieces against plain references: squashed Gaussian, targets, Polyak averaging."""

import copy
import math

import gymnasium as gym
import numpy as np
import torch
from conftest import at
from torch.distributions import Independent, Normal, TransformedDistribution
from torch.distributions.transforms import TanhTransform

from rlcli.actors.normalizer import RunningNorm
from rlcli.actors.offpolicy import Critics, NetworkRecipe, SquashedGaussianPolicy
from rlcli.algos.dqn import DQN, q_learning_target, q_regression_loss
from rlcli.algos.offpolicy import BoxScaler, critics_td_loss, polyak_update, soft_next_value
from rlcli.algos.sac import SAC
from rlcli.algos.td3 import TD3
from rlcli.batches import ReplayBatch


def torso(obs_dim=3, sizes=(16,)):
    return NetworkRecipe(obs_dim, list(sizes), "relu", False, RunningNorm((obs_dim,), enabled=False))


def test_squashed_gaussian_log_prob_matches_torch_tanh_transform():
    torch.manual_seed(0)
    policy = SquashedGaussianPolicy(torso(), 2)
    obs = torch.randn(64, 3)
    torch.manual_seed(1)
    actions, log_probs = policy(obs)
    mean, log_std = policy.net(obs).chunk(2, -1)
    dist = TransformedDistribution(Independent(Normal(mean, log_std.clamp(-20, 2).exp()), 1), [TanhTransform()])
    ref = dist.log_prob(actions.clamp(-1 + 1e-6, 1 - 1e-6))
    well_inside = actions.abs().max(-1).values < 0.999  # atanh is ill-conditioned at the edges
    torch.testing.assert_close(log_probs[well_inside], ref[well_inside], rtol=1e-3, atol=1e-3)
    det, _ = policy(obs, deterministic=True)
    torch.testing.assert_close(det, torch.tanh(mean))


def test_polyak_update_is_a_lerp_and_tau_one_copies():
    src, dst = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    before = copy.deepcopy(dst)
    polyak_update(dst, src, 0.1)
    torch.testing.assert_close(dst.weight, 0.9 * before.weight + 0.1 * src.weight)
    polyak_update(dst, src, 1.0)
    assert torch.equal(dst.weight, src.weight) and torch.equal(dst.bias, src.bias)


def test_box_scaler_maps_unit_box_to_env_bounds():
    scaler = BoxScaler(gym.spaces.Box(np.array([-2.0, 0.0]), np.array([2.0, 10.0])))
    out = scaler.to_env(torch.tensor([[-1.0, -1.0], [0.0, 0.0], [1.0, 1.0], [3.0, -3.0]]))
    np.testing.assert_allclose(out, [[-2, 0], [0, 5], [2, 10], [2, 0]])


class OneBatch:
    def __init__(self, batch):
        self.batch = batch

    def sample(self, *args):
        return self.batch

    def update_priorities(self, indices, td_errors):  # contracts.ReplayStorage: uniform storage, nothing to do
        pass

    def __len__(self):
        return len(self.batch.rewards)


def test_dqn_td_target_plain_and_double():
    """One gradient step with SGD-like Adam is hard to check; check the loss value instead (lr tiny)."""
    for double in (False, True):
        torch.manual_seed(0)
        algo = DQN(torso(), gym.spaces.Discrete(4), num_envs=1, lr=1e-12, batch_size=8, learning_starts=8,
                   double=double, loss="mse", max_grad_norm=None)
        with torch.no_grad():  # make target and online nets differ so that double matters
            for p in algo.networks.q_target.parameters():
                p.add_(torch.randn_like(p))
        batch = ReplayBatch(torch.randn(8, 3), torch.randint(0, 4, (8,)), torch.randn(8), torch.randn(8, 3),
                            torch.tensor([0.99, 0.0] * 4), torch.ones(8), torch.arange(8))
        q_next_target = algo.networks.q_target(batch.next_obs)
        if double:
            next_value = q_next_target.gather(1, algo.networks.q(batch.next_obs).argmax(1, keepdim=True)).squeeze(1)
        else:
            next_value = q_next_target.max(1).values
        target = batch.rewards + batch.discounts * next_value
        q = algo.networks.q(batch.obs).gather(1, batch.actions[:, None]).squeeze(1)
        expected = (q - target).square().mean()
        metrics = algo.update(OneBatch(batch), at(0.0))
        assert math.isclose(float(metrics["value_loss"]), float(expected), rel_tol=1e-5)


def hand_made_batch(obs_dim=3, act_dim=2, n=8):
    torch.manual_seed(3)
    return ReplayBatch(torch.randn(n, obs_dim), torch.rand(n, act_dim) * 2 - 1, torch.randn(n),
                       torch.randn(n, obs_dim), torch.tensor([0.99, 0.0] * (n // 2)), torch.ones(n), torch.arange(n))


def box(dim=2):
    return gym.spaces.Box(-np.ones(dim, np.float32), np.ones(dim, np.float32))


def test_td3_critic_loss_uses_smoothed_target_policy_and_min_of_twin_targets():
    torch.manual_seed(0)
    algo = TD3(torso(), box(), num_envs=1, lr=1e-12, batch_size=8, learning_starts=8, policy_delay=2,
               target_policy_noise=0.2, target_noise_clip=0.5)
    with torch.no_grad():
        for p in algo.networks.critics_target.parameters():
            p.add_(torch.randn_like(p))
    batch = hand_made_batch()
    net = algo.networks
    torch.manual_seed(7)
    noise = (torch.randn(8, 2) * 0.2).clamp(-0.5, 0.5)
    next_actions = (net.policy_target(batch.next_obs) + noise).clamp(-1, 1)
    q1 = net.critics_target.nets[0](batch.next_obs, next_actions)
    q2 = net.critics_target.nets[1](batch.next_obs, next_actions)
    target = batch.rewards + batch.discounts * torch.minimum(q1, q2)
    qs = [c(batch.obs, batch.actions) for c in net.critics.nets]
    expected = sum((q - target).square().mean() for q in qs)
    torch.manual_seed(7)  # the update draws the same smoothing noise first
    metrics = algo.update(OneBatch(batch), at(0.0))
    assert math.isclose(float(metrics["value_loss"]), float(expected), rel_tol=1e-5)
    assert "policy_loss" not in metrics  # delayed: the first gradient step updates only the critics


def test_sac_critic_target_includes_the_entropy_bonus():
    torch.manual_seed(0)
    algo = SAC(torso(), box(), num_envs=1, lr=1e-12, batch_size=8, learning_starts=8, ent_coef=0.3)
    batch = hand_made_batch()
    net = algo.networks
    torch.manual_seed(11)
    next_actions, next_log_probs = net.policy(batch.next_obs)
    next_q = net.critics_target(batch.next_obs, next_actions).min(0).values - 0.3 * next_log_probs
    target = batch.rewards + batch.discounts * next_q
    qs = net.critics(batch.obs, batch.actions)
    expected = 0.5 * (qs - target).square().mean(-1).sum()
    torch.manual_seed(11)
    metrics = algo.update(OneBatch(batch), at(0.0))
    assert math.isclose(float(metrics["value_loss"]), float(expected), rel_tol=1e-5)
    assert math.isclose(float(metrics["alpha"]), 0.3, rel_tol=1e-6)


def test_critics_apply_observation_action_and_common_extractors():
    t = NetworkRecipe(3, [8], "relu", False, RunningNorm((3,), enabled=False), obs_extractor=[5], act_extractor=[4])
    q = Critics(t, 2, 2).nets[0]
    assert q.obs_net[0].in_features == 3 and q.obs_net[0].out_features == 5
    assert q.act_net[0].in_features == 2 and q.act_net[0].out_features == 4
    assert q.common[0].in_features == 9 and q.head.out_features == 1
    out = q(torch.randn(6, 3), torch.randn(6, 2))
    assert out.shape == (6,)
    policy = SquashedGaussianPolicy(t, 2)  # policies use the observation extractor, not the action one
    assert policy.net[0][0].in_features == 3 and policy.net[0][0].out_features == 5


def test_the_gradient_step_runner_samples_steps_feeds_priorities_and_averages_what_each_step_logged():
    from types import SimpleNamespace

    from rlcli.algos.offpolicy import run_gradient_steps

    class Storage:
        def __init__(self):
            self.calls = []

        def sample(self, batch_size, step=0, steps=1):
            self.calls.append(("sample", batch_size, step, steps))
            return SimpleNamespace(indices=torch.tensor([step]), value=float(step))

        def update_priorities(self, indices, td_errors):
            self.calls.append(("priorities", indices.tolist(), td_errors.tolist()))

    def step(batch):  # every step logs a loss; every second one a policy loss; odd steps give no TD errors
        k = batch.value
        metrics = {"loss": torch.tensor(k)}
        if k % 2 == 0:
            metrics["policy_loss"] = torch.tensor(10 * k)
        return (torch.tensor([k + 0.5]) if k % 2 == 0 else None), metrics

    storage = Storage()
    metrics = run_gradient_steps(storage, 32, 4, step)
    assert storage.calls == [("sample", 32, 0, 4), ("priorities", [0], [0.5]), ("sample", 32, 1, 4),
                             ("sample", 32, 2, 4), ("priorities", [2], [2.5]), ("sample", 32, 3, 4)]
    assert metrics["loss"].item() == (0 + 1 + 2 + 3) / 4
    assert metrics["policy_loss"].item() == (0 + 20) / 2  # the mean over the steps that logged it
    assert run_gradient_steps(Storage(), 32, 0, step) == {}


def test_shared_target_and_loss_pieces_against_element_by_element_references():
    """q_learning_target (DQN, R2D2), q_regression_loss, soft_next_value (SAC, CrossQ) and critics_td_loss (SAC,
    CrossQ, TD3), each computed here one element at a time."""
    torch.manual_seed(5)
    rewards, discounts = torch.randn(6, dtype=torch.float64), torch.tensor([0.99, 0.0, 0.9, 0.99, 0.5, 0.0],
                                                                           dtype=torch.float64)
    next_target, next_online = torch.randn(6, 4, dtype=torch.float64), torch.randn(6, 4, dtype=torch.float64)
    for online in (None, next_online):
        got = q_learning_target(rewards, discounts, next_target, online, reward_scale=2.0)
        for i in range(6):
            a = int(np.argmax((next_target if online is None else online)[i].numpy()))
            assert math.isclose(float(got[i]), 2.0 * float(rewards[i]) + float(discounts[i]) * float(next_target[i, a]))
    q, target = torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64) * 3
    for i, (huber, squared) in enumerate(zip(q_regression_loss(q, target, "huber"), q_regression_loss(q, target, "mse"),
                                             strict=True)):
        u = abs(float(q[i]) - float(target[i]))
        assert math.isclose(float(huber), 0.5 * u * u if u < 1 else u - 0.5) and math.isclose(float(squared), u * u)
    next_qs, log_probs, alpha = torch.randn(3, 6, dtype=torch.float64), torch.randn(6, dtype=torch.float64), 0.2
    soft = soft_next_value(next_qs, log_probs, torch.tensor(alpha, dtype=torch.float64))
    for i in range(6):
        assert math.isclose(float(soft[i]), min(float(next_qs[c, i]) for c in range(3)) - alpha * float(log_probs[i]))
    qs, weights = torch.randn(3, 6, dtype=torch.float64), torch.rand(6, dtype=torch.float64)
    loss, priorities = critics_td_loss(qs, target, weights, scale=0.5)
    expected = 0.5 * sum(sum(float(weights[i]) * (float(qs[c, i]) - float(target[i])) ** 2 for i in range(6)) / 6
                         for c in range(3))
    assert math.isclose(float(loss), expected, rel_tol=1e-12)
    for i in range(6):
        assert math.isclose(float(priorities[i]), sum(abs(float(qs[c, i]) - float(target[i])) for c in range(3)) / 3)
