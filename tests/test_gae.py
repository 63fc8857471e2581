"""GAE and returns against a plain Python loop, with terminations and truncations mixed."""

import numpy as np
import torch

from rlcli.buffers.rollout import RolloutBuffer, compute_gae


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


def test_a_rollout_stores_the_envs_numpy_arrays_as_it_stores_their_tensors():
    """The collector hands the envs' rewards and flags over as numpy arrays (a CPU buffer stores them through numpy
    views of its tensors); the stored float32 values are what converting them to tensors first gives, bit for bit,
    and a buffer copied with deepcopy or loaded from a state dict goes on storing into its own tensors."""
    import copy

    rng = np.random.default_rng(0)
    given, converted = (RolloutBuffer(3, 5, (2,), (), True, torch.device("cpu")) for _ in range(2))
    for _ in range(3):
        obs, actions = torch.randn(5, 2), torch.randint(0, 2, (5,))
        log_probs, values = torch.randn(5), torch.randn(5)
        rewards = rng.normal(size=5) * 1e3  # float64, as many envs give them
        terminated, truncated = rng.random(5) < 0.3, rng.random(5) < 0.3
        done = terminated | truncated
        arrays = (rewards, terminated, done, ~truncated)
        given.add(obs, actions, log_probs, values, *arrays)
        converted.add(obs, actions, log_probs, values, *(torch.as_tensor(a, dtype=torch.float32) for a in arrays))
    for name in ("rewards", "terminated", "dones", "valid"):
        assert torch.equal(getattr(given, name), getattr(converted, name)), name
    assert given.rewards.abs().sum() > 0 and given.dones.sum() > 0

    twin = copy.deepcopy(given)
    twin.reset()
    twin.add(obs, actions, log_probs, values, np.full(5, 7.0), terminated, done, ~truncated)
    assert torch.equal(twin.rewards[0], torch.full((5,), 7.0)) and not torch.equal(given.rewards[0], twin.rewards[0])
    given.load_state_dict(twin.state_dict())
    given.reset()
    given.add(obs, actions, log_probs, values, np.full(5, 9.0), terminated, done, ~truncated)
    assert torch.equal(given.rewards[0], torch.full((5,), 9.0)) and torch.equal(twin.rewards[0], torch.full((5,), 7.0))
