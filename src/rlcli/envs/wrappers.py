"""Observation and reward wrappers the env factory applies: sparse rewards, RL-Zoo's time feature, and one-hot
encodings of Discrete / MultiDiscrete / tuple-of-Discrete observations (as SB3 does)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import VectorEnv

from rlcli.registry import ConfigError


class SparseReward(gym.vector.VectorWrapper):
    """`env.sparse_reward=true`: reward 1 on the step an episode terminates (reaches its goal), else 0.
    For tasks whose termination is success (MountainCar, Acrobot): a test return is then a success rate."""

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        obs, _, terminated, truncated, infos = self.env.step(actions)
        return obs, terminated.astype(np.float64), terminated, truncated, infos


class TimeFeature(gym.ObservationWrapper):  # type: ignore[type-arg]
    """RL-Zoo's TimeFeatureWrapper (sb3-contrib; Pardo et al. 2018, "Time Limits in Reinforcement Learning"):
    the observation gets one more entry, 1 - t / max_episode_steps, so that a time-limited task is Markov again.
    Without a registered time limit it counts to 1000, as sb3-contrib does."""

    def __init__(self, env: gym.Env) -> None:  # type: ignore[type-arg]
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            raise ConfigError(f"env.time_feature=true appends an entry to a flat Box observation; the env has {space}")
        self.max_steps = int(env.spec.max_episode_steps) if env.spec and env.spec.max_episode_steps else 1000
        self.observation_space = gym.spaces.Box(np.append(space.low, 0.0).astype(space.dtype),
                                                np.append(space.high, 1.0).astype(space.dtype), dtype=space.dtype)
        self.current_step = 0

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
        self.current_step = 0
        return super().reset(**kwargs)

    def step(self, action: Any) -> tuple[np.ndarray, Any, bool, bool, dict[str, Any]]:
        self.current_step += 1
        return super().step(action)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        feature = 1.0 - self.current_step / self.max_steps
        return np.append(observation, feature).astype(self.observation_space.dtype)


def one_hot_encodable(space: gym.spaces.Space) -> bool:
    return isinstance(space, gym.spaces.Discrete | gym.spaces.MultiDiscrete) or (
        isinstance(space, gym.spaces.Tuple) and all(isinstance(s, gym.spaces.Discrete) for s in space.spaces))


def one_hot_observations(envs: VectorEnv) -> VectorEnv:
    """Discrete observations (FrozenLake, Taxi, CliffWalking) as one-hot vectors; MultiDiscrete ones and tuples of
    Discrete (Blackjack) as their entries' one-hots side by side, as SB3 encodes them: the networks then see a flat
    float Box."""
    space = envs.single_observation_space
    if isinstance(space, gym.spaces.Discrete):
        sizes, starts = np.array([int(space.n)]), np.array([int(space.start)])
    elif isinstance(space, gym.spaces.Tuple):
        sizes = np.array([int(s.n) for s in space.spaces])  # type: ignore[attr-defined]
        starts = np.array([int(s.start) for s in space.spaces])  # type: ignore[attr-defined]
    else:
        assert isinstance(space, gym.spaces.MultiDiscrete)
        sizes, starts = np.asarray(space.nvec).reshape(-1), np.asarray(space.start).reshape(-1)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    width = int(sizes.sum())

    def encode(obs: Any) -> np.ndarray:
        stacked = np.stack(obs, axis=1) if isinstance(obs, tuple) else np.asarray(obs)
        entries = stacked.reshape(len(stacked), -1) - starts  # [envs, entries], each from 0
        out = np.zeros((len(stacked), width), dtype=np.float32)
        np.put_along_axis(out, entries + offsets, 1.0, axis=1)
        return out

    single = gym.spaces.Box(0.0, 1.0, (width,), np.float32)
    batched = gym.spaces.Box(0.0, 1.0, (envs.num_envs, width), np.float32)
    return gym.wrappers.vector.TransformObservation(envs, encode, observation_space=batched,
                                                   single_observation_space=single)
