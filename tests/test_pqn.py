"""PQN: Q(lambda) returns against a plain reference over episode boundaries, the LayerNorm Q-network,
and a short learning run."""

import json

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import run_cli

from rlcli.actors.normalizer import RunningNorm
from rlcli.actors.offpolicy import NetworkRecipe
from rlcli.algos.pqn import PQN, q_lambda_returns
from rlcli.buffers.rollout import compute_gae
from rlcli.registry import ConfigError


def reference_q_lambda(rewards, values, terminated, dones, last_values, gamma, lam):
    """Element by element, per env: walk back from the end; an episode boundary restarts the recursion."""
    steps, envs = rewards.shape
    out = np.zeros((steps, envs))
    for n in range(envs):
        following = last_values[n]
        for t in reversed(range(steps)):
            next_value = values[t + 1, n] if t + 1 < steps else last_values[n]
            if terminated[t, n]:
                g = rewards[t, n]
            elif dones[t, n]:  # truncated: bootstrap from the final observation's greedy value only
                g = rewards[t, n] + gamma * next_value
            else:
                g = rewards[t, n] + gamma * ((1 - lam) * next_value + lam * following)
            out[t, n] = g
            following = g
    return out


def rollout(seed=0, steps=12, envs=3):
    rng = np.random.default_rng(seed)
    rewards, values, last = rng.normal(size=(steps, envs)), rng.normal(size=(steps, envs)), rng.normal(size=envs)
    terminated = np.zeros((steps, envs))
    truncated = np.zeros((steps, envs))
    terminated[3, 0] = terminated[7, 1] = terminated[11, 2] = 1
    truncated[5, 2] = truncated[9, 0] = 1
    return rewards, values, terminated, np.maximum(terminated, truncated), last


@pytest.mark.parametrize("lam", [0.0, 0.65, 1.0])
def test_q_lambda_returns_match_the_reference(lam):
    rewards, values, terminated, dones, last = rollout()
    t = lambda x: torch.tensor(x)  # noqa: E731
    got = q_lambda_returns(t(rewards), t(values), t(terminated), t(dones), t(last), 0.9, lam).numpy()
    np.testing.assert_allclose(got, reference_q_lambda(rewards, values, terminated, dones, last, 0.9, lam),
                               rtol=1e-12)


def test_q_lambda_extremes_are_one_step_targets_and_monte_carlo_returns():
    rewards, values, terminated, dones, last = rollout(seed=1)
    t = lambda x: torch.tensor(x)  # noqa: E731
    one_step = q_lambda_returns(t(rewards), t(values), t(terminated), t(dones), t(last), 0.9, 0.0).numpy()
    next_values = np.concatenate([values[1:], last[None]])
    np.testing.assert_allclose(one_step, rewards + 0.9 * (1 - terminated) * next_values, rtol=1e-12)
    mc = q_lambda_returns(t(rewards), t(values), t(terminated), t(dones), t(last), 0.9, 1.0).numpy()
    # env 1 terminates at step 7: with lambda = 1, step 4's return is the discounted reward sum to it
    assert abs(mc[4, 1] - sum(0.9 ** k * rewards[4 + k, 1] for k in range(4))) < 1e-12


def test_q_lambda_returns_are_the_gae_returns_of_the_greedy_values():
    """The same recursion: G = A + V with GAE over V(s) = max_a Q(s, a) (a cross-check of both)."""
    rewards, values, terminated, dones, last = rollout(seed=2)
    t = lambda x: torch.tensor(x)  # noqa: E731
    _, gae_returns = compute_gae(t(rewards), t(values), t(terminated), t(dones), t(last), 0.97, 0.65)
    torch.testing.assert_close(q_lambda_returns(t(rewards), t(values), t(terminated), t(dones), t(last), 0.97, 0.65),
                               gae_returns)


def pqn(**settings):
    torch.manual_seed(0)
    recipe = NetworkRecipe(4, [16, 8], "relu", True, RunningNorm((4,), enabled=False))
    return PQN(recipe, gym.spaces.Discrete(3), num_envs=2, n_steps=8, **settings)


def test_the_q_network_normalizes_every_hidden_layer_and_acts_greedily_or_at_random():
    algo = pqn()
    norms = [m for m in algo.networks.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert [m.normalized_shape for m in norms] == [(16,), (8,)]
    obs = torch.randn(500, 4)
    greedy = algo.act(obs, deterministic=True)
    q = algo.networks(obs)
    assert torch.equal(greedy.actions, q.argmax(-1)) and torch.allclose(greedy.values, q.max(-1).values)
    algo.epsilon = 1.0
    explore = algo.act(obs)
    assert (explore.actions != greedy.actions).float().mean() > 0.5  # uniformly random: 2/3 differ
    algo.epsilon = 0.0
    assert torch.equal(algo.act(obs).actions, greedy.actions)


def test_pqn_refuses_bad_settings_in_one_line():
    with pytest.raises(ConfigError, match="algo.q_lambda=1.5"):
        pqn(q_lambda=1.5)
    with pytest.raises(ConfigError, match="algo.num_minibatches=99"):
        pqn(num_minibatches=99)


@pytest.mark.slow
def test_pqn_solves_cartpole(tmp_path):
    """The tuned CartPole config (CleanRL's settings with lr 1e-3); stops at the env's threshold (475)."""
    out = run_cli("algo=pqn", "env=CartPole-v1", "seed=1", "log.console=false", f"hydra.run.dir={tmp_path / 'run'}",
                  cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    phases = [json.loads(line) for line in (tmp_path / "run" / "eval.jsonl").read_text().splitlines()]
    assert np.mean(phases[-1]["returns"]) >= 475, phases[-1]
