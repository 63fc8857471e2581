"""A dataset as replay: an offline run samples its batches from the same storage an online run's collector fills.

So an offline algorithm is an ordinary off-policy update over `ReplayBatch`es (rlcli/batches.py); nothing in an
algorithm knows where its transitions came from. Box actions are stored in the unit box [-1, 1], as the off-policy
algorithms act (algos/offpolicy.py BoxScaler); Discrete actions as indices.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from rlcli.buffers.replay import ReplayBuffer
from rlcli.offline.dataset import Dataset


def unit_box_actions(actions: np.ndarray, space: gym.spaces.Space) -> np.ndarray:
    """Env-unit Box actions -> the unit box the algorithms act in (clipped: a dataset may hold actions at the
    bounds' float edge). Discrete actions pass through as int64."""
    if isinstance(space, gym.spaces.Box):
        low, high = space.low.astype(np.float32), space.high.astype(np.float32)
        scaled = 2.0 * (actions.astype(np.float32) - low) / (high - low) - 1.0
        return np.clip(scaled, -1.0, 1.0).reshape(len(actions), *space.shape)
    return actions.astype(np.int64).reshape(len(actions))


def fill_replay(buffer: ReplayBuffer, dataset: Dataset, action_space: gym.spaces.Space,
                reward_factor: float = 1.0) -> None:
    """Write every transition of `dataset` into `buffer` (one-step: discount = gamma, 0 where terminated).
    The buffer must hold them all; an offline-to-online run gives it room for the online steps after them.
    `reward_factor`: the stored rewards are the dataset's times this (offline.reward_scale / reward_factor)."""
    n = len(dataset)
    if buffer.n_step != 1:
        raise ValueError("fill_replay: a dataset fills one-step replay (buffer.n_step=1)")
    if buffer.capacity < n:
        raise ValueError(f"fill_replay: the buffer holds {buffer.capacity:,} transitions, the dataset {n:,}")
    if n == 0:
        return
    discounts = buffer.gamma * (1.0 - dataset.terminations.astype(np.float32))
    actions = unit_box_actions(dataset.actions, action_space)
    buffer._write(buffer._obs(dataset.observations), torch.as_tensor(actions, device=buffer.storage),
                  buffer._t(dataset.rewards * np.float32(reward_factor) if reward_factor != 1.0 else dataset.rewards),
                  buffer._obs(dataset.next_observations), buffer._t(discounts))
