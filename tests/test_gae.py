"""GAE and returns against a plain Python loop, with terminations and truncations mixed."""

import numpy as np
import torch

from rlcli.buffers.rollout import compute_gae


def reference_gae(rewards, values, terminated, dones, last_values, gamma, lam):
    """Straightforward per-env, per-step recursion written independently of the vectorized code."""
    T, N = len(rewards), len(rewards[0])
    adv = [[0.0] * N for _ in range(T)]
    for n in range(N):
        running = 0.0
        for t in reversed(range(T)):
            next_value = last_values[n] if t == T - 1 else values[t + 1][n]
            bootstrap = 0.0 if terminated[t][n] else gamma * next_value
            delta = rewards[t][n] + bootstrap - values[t][n]
            running = delta + (0.0 if dones[t][n] else gamma * lam * running)
            adv[t][n] = running
    returns = [[adv[t][n] + values[t][n] for n in range(N)] for t in range(T)]
    return adv, returns


def test_gae_matches_reference_with_mixed_terminations_and_truncations():
    rng = np.random.default_rng(0)
    T, N = 17, 5
    rewards = rng.normal(size=(T, N))
    values = rng.normal(size=(T, N))
    last_values = rng.normal(size=N)
    terminated = rng.random((T, N)) < 0.1
    truncated = (rng.random((T, N)) < 0.1) & ~terminated
    dones = terminated | truncated
    assert terminated.any() and truncated.any()
    for gamma, lam in [(0.99, 0.95), (0.9, 1.0), (0.98, 0.0)]:
        adv, ret = compute_gae(
            *(torch.tensor(x, dtype=torch.float64) for x in (rewards, values, terminated, dones, last_values)),
            gamma, lam,
        )
        ref_adv, ref_ret = reference_gae(rewards.tolist(), values.tolist(), terminated.tolist(),
                                         dones.tolist(), last_values.tolist(), gamma, lam)
        np.testing.assert_allclose(adv.numpy(), ref_adv, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(ret.numpy(), ref_ret, rtol=1e-12, atol=1e-12)


def test_truncation_bootstraps_from_final_observation_value_and_termination_does_not():
    # One env, NEXT_STEP layout: step 0 ends the episode, step 1 is the reset step whose stored
    # value is V(final observation) = 10.
    rewards = torch.tensor([[1.0], [0.0]])
    values = torch.tensor([[0.0], [10.0]])
    last = torch.tensor([0.0])
    done = torch.tensor([[1.0], [0.0]])
    adv_trunc, _ = compute_gae(rewards, values, torch.zeros(2, 1), done, last, 0.5, 1.0)
    adv_term, _ = compute_gae(rewards, values, done, done, last, 0.5, 1.0)
    assert adv_trunc[0, 0].item() == 1.0 + 0.5 * 10.0
    assert adv_term[0, 0].item() == 1.0


def test_lambda_one_gives_discounted_monte_carlo_returns():
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    values = torch.zeros(3, 1)
    zeros = torch.zeros(3, 1)
    _, returns = compute_gae(rewards, values, zeros, zeros, torch.tensor([4.0]), 0.5, 1.0)
    expected = [1 + 0.5 * 2 + 0.25 * 3 + 0.125 * 4, 2 + 0.5 * 3 + 0.25 * 4, 3 + 0.5 * 4]
    np.testing.assert_allclose(returns[:, 0].numpy(), expected)
