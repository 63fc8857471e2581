"""HER relabeling against a plain reference, the bit-flipping env, and the goal-env plumbing."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlcli.buffers.her import HerReplayBuffer
from rlcli.envs import GymEnvFactory
from rlcli.envs.bit_flipping import BitFlippingEnv
from rlcli.registry import ConfigError

N = 4  # bits


def make_buffer(strategy: str, k: int = 4, capacity: int = 1000) -> tuple[HerReplayBuffer, BitFlippingEnv]:
    factory = GymEnvFactory("BitFlipping-v0", kwargs={"n_bits": N})
    envs = factory.make(2, "sync")
    buf = HerReplayBuffer(capacity, k, strategy, num_envs=2, obs_shape=(3 * N,), action_shape=(), discrete=True,
                          device=torch.device("cpu"), gamma=0.9, goal=factory.goal)
    return buf, envs


def fill(buf, envs, steps=200, seed=0):
    rng = np.random.default_rng(seed)
    obs, _ = envs.reset(seed=seed)
    prev_done = np.zeros(2, bool)
    for _ in range(steps):
        actions = rng.integers(0, N, 2)
        next_obs, rewards, terminated, truncated, _ = envs.step(actions)
        done = terminated | truncated
        buf.add(torch.as_tensor(obs), torch.as_tensor(actions), rewards, next_obs, terminated, done, ~prev_done)
        obs, prev_done = next_obs, done


def episodes_of(buf):
    """Reference: the stored episodes, each a list of ring positions in order."""
    eps = {}
    for pos in range(len(buf)):
        eps.setdefault(int(buf.ep_start[pos]), []).append(pos)
    return {start: sorted(ps, key=lambda p: p) for start, ps in eps.items()}


def test_goal_layout_of_the_flattened_bit_flipping_observation():
    factory = GymEnvFactory("BitFlipping-v0", kwargs={"n_bits": N})
    envs = factory.make(2, "sync")
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (2, 3 * N)
    raw = envs.unwrapped.envs[0].unwrapped  # the first sub-env behind the wrappers
    np.testing.assert_array_equal(obs[0, factory.goal.desired], raw.goal)
    np.testing.assert_array_equal(obs[0, factory.goal.achieved], raw.state)


@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
def test_relabeled_goals_come_from_the_same_episode_and_rewards_are_recomputed(strategy):
    torch.manual_seed(0)
    buf, envs = make_buffer(strategy)
    fill(buf, envs)
    layout = buf.goal
    episodes = episodes_of(buf)
    where = {pos: (start, i) for start, ps in episodes.items() for i, pos in enumerate(ps)}
    batch = buf.sample(512)
    relabeled = 0
    for row in range(512):
        pos = int(batch.indices[row])
        start, i = where[pos]
        ep = episodes[start]
        new_goal = batch.obs[row, layout.desired].numpy()
        if np.array_equal(new_goal, buf.obs[pos, layout.desired]):
            candidates_ok = True  # not relabeled (or relabeled to the same goal)
        else:
            relabeled += 1
            achieved = [buf.next_obs[p, layout.achieved] for p in ep]
            allowed = {"future": achieved[i:], "final": achieved[-1:], "episode": achieved}[strategy]
            candidates_ok = any(np.array_equal(new_goal, a) for a in allowed)
        assert candidates_ok, (strategy, row)
        # reward and discount follow the (possibly new) goal, as the env would compute them
        achieved_next = batch.next_obs[row, layout.achieved].numpy()
        success = np.array_equal(achieved_next, new_goal)
        assert batch.rewards[row].item() == (0.0 if success else -1.0)
        assert np.isclose(batch.discounts[row].item(), 0.0 if success else 0.9)
        np.testing.assert_array_equal(batch.next_obs[row, layout.desired].numpy(), new_goal)
    assert 0.6 < relabeled / 512 <= 0.8 + 0.05  # about k / (k + 1) = 0.8 (a few relabel to the same goal)


def test_her_without_a_goal_env_is_a_one_line_error():
    from rlcli.buffers.her import her

    with pytest.raises(ConfigError, match="buffer=her needs a goal-conditioned env"):
        her(num_envs=1, obs_shape=(4,), action_shape=(), discrete=True, device=torch.device("cpu"), gamma=0.99,
            goal=None)


def test_her_buffer_survives_overwriting_older_episodes():
    torch.manual_seed(1)
    buf, envs = make_buffer("episode", capacity=37)
    fill(buf, envs, steps=300)
    assert len(buf) == 37
    batch = buf.sample(256)  # 'episode' may reach back past overwritten starts: clamped to what is stored
    stored_goals = {tuple(g) for g in buf.next_obs[:, buf.goal.achieved]}
    stored_goals |= {tuple(g) for g in buf.obs[:, buf.goal.desired]}
    for row in batch.obs[:, buf.goal.desired].numpy():
        assert tuple(row) in stored_goals


def test_continuous_bit_flipping_flips_every_bit_whose_action_is_positive():
    env = BitFlippingEnv(n_bits=4, continuous=True)
    assert env.action_space == gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    obs, _ = env.reset(seed=0)
    before = obs["observation"].copy()
    obs, *_ = env.step(np.array([0.5, -0.5, 0.0, 1.0], np.float32))
    np.testing.assert_array_equal(obs["observation"], np.where([True, False, False, True], 1 - before, before))
    assert BitFlippingEnv(n_bits=4).action_space == gym.spaces.Discrete(4)  # the HER paper's task by default
