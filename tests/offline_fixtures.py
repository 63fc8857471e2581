"""Small Pendulum-v1 datasets for the offline tests, made in well under a second without training anything.

`pendulum_controller` is an energy-pumping swing-up with a PD catch at the top: about -130 to -190 mean return
(a trained SAC gets about -150, a random policy about -1,200), so "expert" data is cheap. With
`noise` its torque is perturbed (the "medium" kind); with `random_fraction` some episodes act uniformly at random.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from rlcli.buffers.replay import ReplayBuffer
from rlcli.offline.dataset import Dataset
from rlcli.offline.replay import fill_replay

PENDULUM_RANDOM_RETURN = -1200.0  # about a uniform policy's mean return (ref_min for the normalized score)
PENDULUM_EXPERT_RETURN = -132.0  # the controller's mean return over 10 episodes (ref_max)


def pendulum_controller(obs: np.ndarray) -> np.ndarray:
    """Torque in [-2, 2] from [cos, sin, angular velocity]: pump energy toward the upright's (0.5 w^2 + 15 cos th
    is conserved without torque), then hold with PD near the top."""
    c, s, w = obs[..., 0], obs[..., 1], obs[..., 2]
    energy = 0.5 * w**2 + 15.0 * c
    swing = np.clip(0.5 * np.sign(w + 1e-6) * (15.5 - energy), -2.0, 2.0)
    hold = np.clip(-(10.0 * np.arctan2(s, c) + 2.0 * w), -2.0, 2.0)
    return np.where(c > 0.9, hold, swing)[..., None].astype(np.float32)


def pendulum_dataset(steps: int, seed: int = 0, noise: float = 0.0, random_fraction: float = 0.0) -> Dataset:
    """`steps` transitions of Pendulum-v1 (whole 200-step episodes, the last one cut short and truncated)."""
    env = gym.make("Pendulum-v1")
    rng = np.random.default_rng(seed)
    rows: dict[str, list] = {k: [] for k in ("obs", "act", "rew", "next", "term", "trunc")}
    episode = 0
    while len(rows["rew"]) < steps:
        obs, _ = env.reset(seed=seed * 10_000 + episode)
        at_random = rng.random() < random_fraction
        done = False
        while not done and len(rows["rew"]) < steps:
            if at_random:
                action = rng.uniform(-2.0, 2.0, size=(1,)).astype(np.float32)
            else:
                action = pendulum_controller(obs)
                if noise:
                    action = np.clip(action + noise * rng.standard_normal(1), -2.0, 2.0).astype(np.float32)
            next_obs, reward, terminated, truncated, _ = env.step(action)
            truncated = truncated or len(rows["rew"]) + 1 == steps
            for key, value in zip(rows, (obs, action, reward, next_obs, terminated, truncated), strict=True):
                rows[key].append(value)
            obs, done = next_obs, terminated or truncated
        episode += 1
    env.close()
    return Dataset(np.array(rows["obs"], np.float32), np.array(rows["act"], np.float32),
                   np.array(rows["rew"], np.float32), np.array(rows["next"], np.float32),
                   np.array(rows["term"], bool), np.array(rows["trunc"], bool), env_id="Pendulum-v1",
                   ref_min_score=PENDULUM_RANDOM_RETURN, ref_max_score=PENDULUM_EXPERT_RETURN,
                   name=f"pendulum-controller-noise{noise}", metadata={"seed": seed})


def dataset_replay(dataset: Dataset, action_space: gym.spaces.Space, gamma: float = 0.99,
                   device: str = "cpu") -> ReplayBuffer:
    """The dataset in a replay buffer of exactly its size, as an offline run samples it."""
    obs_shape = dataset.observations.shape[1:]
    discrete = isinstance(action_space, gym.spaces.Discrete)
    buffer = ReplayBuffer(len(dataset), 1, 1, obs_shape, () if discrete else action_space.shape, discrete,
                          torch.device(device), gamma)
    fill_replay(buffer, dataset, action_space)
    return buffer


def mean_return(act, episodes: int = 5, seed: int = 100) -> float:
    """Mean return of `act(obs [3]) -> torque [1]` (env units) on Pendulum-v1."""
    env = gym.make("Pendulum-v1")
    total = 0.0
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        done = False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            total += float(reward)
            done = terminated or truncated
    env.close()
    return total / episodes
