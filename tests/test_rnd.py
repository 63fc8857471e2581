"""rnd_ppo: the intrinsic-reward filter and normalization, the two GAEs, warm-up, novelty, bad input."""

import numpy as np
import pytest
import torch
from conftest import at
from test_configs import composed

from rlcli.algos.rnd import RandomNetworkDistillation, discounted_forward_filter
from rlcli.registry import ConfigError
from rlcli.run.build import build

QUIET = ["log.console=false", "log.tensorboard=false"]


def plain_gae(rewards, values, last_values, gamma, lam, terminated=None, dones=None):
    """Textbook GAE, one env at a time, in plain Python (the reference the tensor version must match)."""
    steps, envs = rewards.shape
    terminated = np.zeros_like(rewards) if terminated is None else terminated
    dones = np.zeros_like(rewards) if dones is None else dones
    adv = np.zeros_like(rewards)
    for n in range(envs):
        running = 0.0
        for t in reversed(range(steps)):
            next_value = last_values[n] if t == steps - 1 else values[t + 1, n]
            delta = rewards[t, n] + gamma * next_value * (1 - terminated[t, n]) - values[t, n]
            running = delta + gamma * lam * (1 - dones[t, n]) * running
            adv[t, n] = running
    return adv, adv + values


def test_forward_filter_is_the_running_discounted_sum():
    rewards = torch.tensor([[1.0, 0.0], [2.0, 1.0], [0.0, 3.0]])
    running = torch.tensor([0.5, 0.0])
    out = discounted_forward_filter(rewards, running, gamma=0.9)
    expected = [[0.9 * 0.5 + 1, 0.0], [0.9 * (0.45 + 1) + 2, 1.0], [0.9 * (0.9 * 1.45 + 2), 0.9 + 3]]
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(running.numpy(), expected[-1], rtol=1e-6)  # carried into the next rollout


def rnd_parts(*extra):
    cfg = composed("algo=rnd_ppo", "env=MountainCar-v0", "train.num_envs=2", "algo.n_steps=16", "algo.batch_size=32",
                   "algo.n_epochs=1", *extra, *QUIET)
    return build(cfg)


def test_intrinsic_rewards_are_normalized_and_both_gaes_combined():
    parts = rnd_parts("algo.obs_norm_warmup_steps=0", "algo.ext_coef=2.0", "algo.int_coef=0.5",
                          "algo.int_gamma=0.9", "algo.gamma=0.99", "algo.gae_lambda=0.8")
    algo, buffer = parts.algo, parts.buffer
    rnd_before = RandomNetworkDistillation(2, [64, 64], 64)
    rnd_before.load_state_dict(algo.rnd.state_dict())  # RND as it was when the rewards were computed
    parts.collector.collect(parts.learner)
    last_obs = algo.networks.normalizer(parts.collector.obs)  # the tuned config normalizes observations
    next_obs = torch.cat([buffer.obs[1:], last_obs.unsqueeze(0)], 0)
    with torch.no_grad():
        raw = (rnd_before.errors(next_obs) * buffer.valid).numpy()
        last_values = algo.networks.value(last_obs).numpy()
    # the divisor is the spread of the discounted running sums, merged with the normalizer's prior
    # (mean 0, variance 1, weight 1e-4 of a sample)
    sums = np.zeros_like(raw)
    running = np.zeros(2)
    for t in range(raw.shape[0]):
        running = 0.9 * running + raw[t]
        sums[t] = running
    prior, n = 1e-4, sums.size
    var = (prior + sums.var() * n + sums.mean() ** 2 * prior * n / (prior + n)) / (prior + n)
    normalized = raw / np.sqrt(var)
    values = buffer.values.numpy()
    adv_int, ret_int = plain_gae(normalized, values[..., 1], last_values[:, 1], 0.9, 0.8)  # never cut by episodes
    adv_ext, ret_ext = plain_gae(buffer.rewards.numpy(), values[..., 0], last_values[:, 0], 0.99, 0.8,
                                 buffer.terminated.numpy(), buffer.dones.numpy())
    np.testing.assert_allclose(buffer.returns[..., 1].numpy(), ret_int, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(buffer.returns[..., 0].numpy(), ret_ext, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(buffer.advantages.numpy(), 2.0 * adv_ext + 0.5 * adv_int, rtol=1e-3, atol=1e-4)
    # RND's observation statistics were updated after the rewards, with the rollout's next observations
    assert float(algo.rnd.obs_norm.count) == pytest.approx(32 + 1e-4)
    metrics = algo.update(buffer, at(0.0))
    assert {"rnd_loss", "intrinsic_reward", "value_loss", "explained_variance"} <= set(metrics)
    parts.close()


def test_warmup_only_gathers_observation_statistics():
    parts = rnd_parts("algo.obs_norm_warmup_steps=40")  # 2 rollouts of 2 x 16 steps
    algo, buffer = parts.algo, parts.buffer
    before = {k: v.clone() for k, v in algo.networks.state_dict().items() if not k.startswith("normalizer.")}
    predictor = [p.clone() for p in algo.rnd.predictor.parameters()]
    for rollout in range(2):
        parts.collector.collect(parts.learner)
        assert algo.warming_up
        metrics = algo.update(buffer, at(0.0))
        assert float(metrics["rnd_warmup_steps"]) == 32 * (rollout + 1)
    assert all(torch.equal(v, algo.networks.state_dict()[k]) for k, v in before.items())
    assert all(torch.equal(a, b) for a, b in zip(predictor, algo.rnd.predictor.parameters(), strict=True))
    assert float(algo.rnd.obs_norm.count) == pytest.approx(64 + 1e-4)
    parts.collector.collect(parts.learner)  # the third rollout learns
    assert not algo.warming_up
    algo.update(buffer, at(0.0))
    assert not all(torch.equal(a, b) for a, b in zip(predictor, algo.rnd.predictor.parameters(), strict=True))
    parts.close()


def test_warmup_rollouts_have_no_intrinsic_reward():
    parts = rnd_parts("algo.obs_norm_warmup_steps=1")
    algo, buffer = parts.algo, parts.buffer
    parts.collector.collect(parts.learner)
    # with zero intrinsic rewards the intrinsic returns are the values bootstrapped with int_gamma alone
    with torch.no_grad():
        last = algo.networks.value(algo.networks.normalizer(parts.collector.obs))[:, 1]
    _, expected = plain_gae(np.zeros((16, 2)), buffer.values[..., 1].numpy(), last.numpy(), 0.99, 0.95)
    np.testing.assert_allclose(buffer.returns[..., 1].numpy(), expected, rtol=1e-4, atol=1e-5)
    parts.close()


def test_the_predictor_error_falls_on_seen_states_only():
    torch.manual_seed(0)
    rnd = RandomNetworkDistillation(2, [64, 64], 64)
    seen = torch.randn(256, 2) * 0.3
    unseen = torch.randn(256, 2) * 0.3 + 3.0
    rnd.obs_norm.update(torch.cat([seen, unseen]))
    optimizer = torch.optim.Adam(rnd.predictor.parameters(), lr=1e-3)
    for _ in range(300):
        optimizer.zero_grad()
        rnd.errors(seen).mean().backward()
        optimizer.step()
    with torch.no_grad():
        assert rnd.errors(seen).mean() < 0.2 * rnd.errors(unseen).mean()


@pytest.mark.parametrize(("overrides", "message"), [
    (["actor=gru"], "algo=rnd_ppo does not support actor=gru yet; choose from: mlp"),
    (["env=PixelGoal-v0", "actor=mlp"], "algo=rnd_ppo normalizes observations entry by entry and needs a flat Box"),
    (["algo.update_proportion=0"], "algo.update_proportion=0 is invalid: must be in (0, 1]"),
    (["algo.int_gamma=1.5"], "algo.int_gamma=1.5 is invalid"),
    (["+algo.int_coeff=1"], "unknown key 'algo.int_coeff' (did you mean 'algo.int_coef'?)"),
])
def test_bad_rnd_settings_are_one_line(overrides, message):
    with pytest.raises(ConfigError, match=None) as error:
        build(composed("algo=rnd_ppo", "env=MountainCar-v0", *overrides, *QUIET))
    assert message in str(error.value) and "\n" not in str(error.value)
