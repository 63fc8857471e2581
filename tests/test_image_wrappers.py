"""Image preprocessing for non-Atari envs (envs/image.py), against SB3 / RL-Zoo's own wrappers' behaviour."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from conftest import run_cli

from rlcli.envs import GymEnvFactory
from rlcli.envs.image import FrameSkip, stack_frames
from rlcli.registry import ConfigError


class Frames(gym.Env):  # type: ignore[type-arg]
    """Frame t is filled with t (so stacks and skips are readable); reward t; ends at step `length`."""

    observation_space = gym.spaces.Box(0, 255, (4, 5, 1), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length: int = 10) -> None:
        self.length, self.t = length, 0

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return np.full((4, 5, 1), 0, np.uint8), {}

    def step(self, action):
        self.t += 1
        return np.full((4, 5, 1), self.t, np.uint8), float(self.t), self.t >= self.length, False, {}


def test_frame_skip_repeats_the_action_sums_rewards_and_stops_at_the_episode_end():
    env = FrameSkip(Frames(length=5), skip=2)
    env.reset()
    obs, reward, terminated, *_ = env.step(0)
    assert obs[0, 0, 0] == 2 and reward == 1 + 2 and not terminated
    env.step(0)
    obs, reward, terminated, *_ = env.step(0)  # frame 5 ends the episode: no sixth frame
    assert obs[0, 0, 0] == 5 and reward == 5 and terminated


def test_stacked_images_are_sb3_vecframestacks_channels_last_image():
    from stable_baselines3.common.vec_env import DummyVecEnv, VecFrameStack

    ours = stack_frames(Frames(), 3)
    theirs = VecFrameStack(DummyVecEnv([Frames]), n_stack=3, channels_order="last")
    assert ours.observation_space.shape == theirs.observation_space.shape[-3:] == (4, 5, 3)
    np.testing.assert_array_equal(ours.reset()[0], theirs.reset()[0])
    for _ in range(4):
        np.testing.assert_array_equal(ours.step(0)[0], theirs.step(np.array([0]))[0][0])


def test_carracing_gets_rl_zoos_preprocessing():
    pytest.importorskip("Box2D")
    envs = GymEnvFactory("CarRacing-v3", frame_skip=2, resize=[64, 64], grayscale=True, frame_stack=2).make(1, "sync")
    try:
        assert envs.single_observation_space.shape == (64, 64, 2)
        obs, _ = envs.reset(seed=0)
        assert obs.dtype == np.uint8 and obs[0, ..., 0].max() == 0 < obs[0, ..., 1].max()  # zeros before frame one
    finally:
        envs.close()


def test_bad_image_settings_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match="env.atari=true already skips"):
        GymEnvFactory("ALE/Pong-v5", atari=True, frame_skip=2)
    out = run_cli("algo=ppo", "env=Pendulum-v1", "env.grayscale=true", f"hydra.run.dir={tmp_path / 'run'}",
                  cwd=tmp_path)
    assert out.returncode == 2 and "env.grayscale needs channels-last image observations" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()
