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
CARTPOLE_RANDOM_RETURN = 22.0  # about a uniform policy's mean return on CartPole-v1


def pendulum_controller(obs: np.ndarray) -> np.ndarray:
    """Torque in [-2, 2] from [cos, sin, angular velocity]: pump energy toward the upright's (0.5 w^2 + 15 cos th
    is conserved without torque), then hold with PD near the top."""
    c, s, w = obs[..., 0], obs[..., 1], obs[..., 2]
    energy = 0.5 * w**2 + 15.0 * c
    swing = np.clip(0.5 * np.sign(w + 1e-6) * (15.5 - energy), -2.0, 2.0)
    hold = np.clip(-(10.0 * np.arctan2(s, c) + 2.0 * w), -2.0, 2.0)
    return np.where(c > 0.9, hold, swing)[..., None].astype(np.float32)


def rollout_dataset(env_id: str, policy, steps: int, seed: int = 0, name: str = "dataset",
                    ref_scores: tuple[float | None, float | None] = (None, None)) -> Dataset:
    """`steps` transitions of `env_id` acted by `policy(obs, rng, t) -> action` (t: the step within its episode),
    whole episodes, the last one cut short and marked truncated; episode k resets with seed `seed * 10_000 + k`."""
    env = gym.make(env_id)
    rng = np.random.default_rng(seed)
    rows: dict[str, list] = {k: [] for k in ("obs", "act", "rew", "next", "term", "trunc")}
    episode = 0
    while len(rows["rew"]) < steps:
        obs, _ = env.reset(seed=seed * 10_000 + episode)
        done, t = False, 0
        while not done and len(rows["rew"]) < steps:
            action = policy(obs, rng, t)
            t += 1
            next_obs, reward, terminated, truncated, _ = env.step(action)
            truncated = truncated or len(rows["rew"]) + 1 == steps
            for key, value in zip(rows, (obs, action, reward, next_obs, terminated, truncated), strict=True):
                rows[key].append(value)
            obs, done = next_obs, terminated or truncated
        episode += 1
    env.close()
    discrete = isinstance(env.action_space, gym.spaces.Discrete)
    return Dataset(np.array(rows["obs"], np.float32), np.array(rows["act"], np.int64 if discrete else np.float32),
                   np.array(rows["rew"], np.float32), np.array(rows["next"], np.float32),
                   np.array(rows["term"], bool), np.array(rows["trunc"], bool), env_id=env_id,
                   ref_min_score=ref_scores[0], ref_max_score=ref_scores[1], name=name, metadata={"seed": seed})


def pendulum_dataset(steps: int, seed: int = 0, noise: float = 0.0, random_fraction: float = 0.0) -> Dataset:
    """Pendulum-v1 from the swing-up controller, its torque perturbed by Gaussian `noise`; each episode acts
    uniformly at random instead with probability `random_fraction`."""
    at_random = [False]

    def policy(obs: np.ndarray, rng: np.random.Generator, t: int) -> np.ndarray:
        if t == 0:  # each episode is the controller's or a random policy's throughout
            at_random[0] = rng.random() < random_fraction
        if at_random[0]:
            return rng.uniform(-2.0, 2.0, size=(1,)).astype(np.float32)
        action = pendulum_controller(obs)
        if noise:
            action = np.clip(action + noise * rng.standard_normal(1), -2.0, 2.0).astype(np.float32)
        return action

    return rollout_dataset("Pendulum-v1", policy, steps, seed, f"pendulum-controller-noise{noise}",
                           (PENDULUM_RANDOM_RETURN, PENDULUM_EXPERT_RETURN))


def cartpole_controller(obs: np.ndarray) -> int:
    """Push toward where the pole is falling (its angle, angular rate and a little cart velocity): 500 each time."""
    return int(obs[2] + 0.5 * obs[3] + 0.05 * obs[1] > 0)


def cartpole_dataset(steps: int, seed: int = 0, random_fraction: float = 0.1) -> Dataset:
    """CartPole-v1 from `cartpole_controller`, each action replaced by a random one with probability
    `random_fraction` (so the data also shows falls and recoveries)."""

    def policy(obs: np.ndarray, rng: np.random.Generator, t: int) -> int:
        return int(rng.integers(2)) if rng.random() < random_fraction else cartpole_controller(obs)

    return rollout_dataset("CartPole-v1", policy, steps, seed, f"cartpole-controller-random{random_fraction}",
                           (CARTPOLE_RANDOM_RETURN, 500.0))


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


def dataset_file(kind: str) -> str:
    """A small dataset as an .npz path, made once per machine and reused (xdist workers may race: the write is
    atomic and the contents deterministic): `pendulum` (2,000 noisy-controller steps) or `cartpole` (2,000)."""
    import os
    import tempfile
    from pathlib import Path

    from rlcli.offline.save import save_npz

    makers = {"pendulum": lambda: pendulum_dataset(2000, noise=0.3), "cartpole": lambda: cartpole_dataset(2000)}
    path = Path(tempfile.gettempdir()) / "rlcli-test-datasets" / f"{kind}-2000-v1.npz"
    if not path.exists():
        mine = save_npz(makers[kind](), path.with_name(f"{path.stem}-{os.getpid()}.npz"), overwrite=True)
        mine.replace(path)
    return str(path)
