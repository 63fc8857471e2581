"""A dataset as replay: an offline run samples its batches from the same storage an online run's collector fills.

So an offline algorithm is an ordinary off-policy update over `ReplayBatch`es (rlcli/batches.py); nothing in an
algorithm knows where its transitions came from. Box actions are stored in the unit box [-1, 1], as the off-policy
algorithms act (algos/offpolicy.py BoxScaler); Discrete actions as indices.
"""

from __future__ import annotations

import weakref
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlcli.batches import ReplayBatch
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
    `reward_factor`: the stored rewards are the dataset's times this (offline.reward_scale / reward_factor).
    A plain replay storage of exactly the dataset's size is never written again, so storages filled alike from the
    same dataset in one process (a population's members) share one copy of its tensors."""
    n = len(dataset)
    if buffer.n_step != 1:
        raise ValueError("fill_replay: a dataset fills one-step replay (buffer.n_step=1)")
    if buffer.capacity < n:
        raise ValueError(f"fill_replay: the buffer holds {buffer.capacity:,} transitions, the dataset {n:,}")
    if n == 0:
        return
    key = _sharing_key(buffer, dataset, action_space, reward_factor)
    if key is not None and _share(buffer, dataset, key):
        return
    discounts = buffer.gamma * (1.0 - dataset.terminations.astype(np.float32))
    actions = unit_box_actions(dataset.actions, action_space)
    buffer._write(buffer._obs(dataset.observations), torch.as_tensor(actions, device=buffer.storage),
                  buffer._t(dataset.rewards * np.float32(reward_factor) if reward_factor != 1.0 else dataset.rewards),
                  buffer._obs(dataset.next_observations), buffer._t(discounts))
    if key is not None:
        _FILLED[key] = (weakref.ref(dataset), *(weakref.ref(getattr(buffer, name)) for name in _FIELDS))


_FIELDS = ("obs", "next_obs", "actions", "rewards", "discounts")
# (the dataset's id and what the filled tensors depend on) -> weak references to the dataset and those tensors
_FILLED: dict[tuple[Any, ...], tuple[weakref.ref[Any], ...]] = {}


def _sharing_key(buffer: ReplayBuffer, dataset: Dataset, action_space: gym.spaces.Space,
                 reward_factor: float) -> tuple[Any, ...] | None:
    """None where the storage may be written after the dataset (room for online steps) or keeps more per slot
    than its tensors (prioritized replay's priorities)."""
    if type(buffer) is not ReplayBuffer or buffer.capacity != len(dataset):
        return None
    return (id(dataset), float(reward_factor), float(buffer.gamma), repr(action_space), str(buffer.storage),
            buffer.obs_dtype, buffer.capacity)


def _share(buffer: ReplayBuffer, dataset: Dataset, key: tuple[Any, ...]) -> bool:
    """Point `buffer` at the tensors an alike storage was filled with from this very dataset (False: none alive)."""
    held = [ref() for ref in _FILLED.get(key, ())]
    if not held or any(x is None for x in held) or held[0] is not dataset:
        return False
    for name, tensor in zip(_FIELDS, held[1:], strict=True):
        setattr(buffer, name, tensor)
    buffer.pos, buffer.size = len(dataset) % buffer.capacity, len(dataset)
    return True


class MixedReplay:
    """An offline-to-online run's storage: the dataset first (rows [0, dataset_size)), then what the collector adds
    online, in one ReplayBuffer of room for both. Once online experience exists, each batch draws
    `offline_fraction` of its rows from the dataset and the rest from the online rows (Cal-QL's symmetric sampling
    at 0.5; None: uniform over everything stored), or a share annealed linearly to `final_fraction` over the
    `online_steps`. Online rewards are scaled as the dataset's were. A checkpoint
    holds the online rows only: the dataset is read again on resume."""

    def __init__(self, storage: ReplayBuffer, dataset_size: int, offline_fraction: float | None,
                 reward_factor: float = 1.0, final_fraction: float | None = None, online_steps: int = 0) -> None:
        self.storage, self.dataset_size = storage, dataset_size
        self.offline_fraction, self.reward_factor = offline_fraction, reward_factor
        self.final_fraction, self.online_steps = final_fraction, online_steps
        self.capacity = storage.capacity
        self.default_schedules = storage.default_schedules

    def __len__(self) -> int:
        return len(self.storage)

    # the storage's rows, read by algorithms that look past a batch (ReBRAC's next data action)
    @property
    def obs(self) -> torch.Tensor:
        return self.storage.obs

    @property
    def next_obs(self) -> torch.Tensor:
        return self.storage.next_obs

    @property
    def actions(self) -> torch.Tensor:
        return self.storage.actions

    def add(self, obs: torch.Tensor, actions: torch.Tensor, rewards: np.ndarray, next_obs: np.ndarray,
            terminated: np.ndarray, dones: np.ndarray, valid: np.ndarray) -> None:
        if self.reward_factor != 1.0:
            rewards = rewards * np.float32(self.reward_factor)
        self.storage.add(obs, actions, rewards, next_obs, terminated, dones, valid)

    def sample(self, batch_size: int, step: int = 0, steps: int = 1) -> ReplayBatch:
        size, n = self.storage.size, self.dataset_size
        if self.offline_fraction is None or size <= n:
            return self.storage.sample(batch_size, step, steps)
        from_data = int(round(self.fraction_now() * batch_size))
        idx = torch.cat([torch.randint(0, n, (from_data,)), torch.randint(n, size, (batch_size - from_data,))])
        return self.storage._batch(idx)

    def fraction_now(self) -> float:
        """The dataset's share of a batch: `offline_fraction`, or (with `final_fraction`) linear from it to
        `final_fraction` over the online steps, read from the online rows stored (so a resume draws as the unbroken
        run did)."""
        assert self.offline_fraction is not None
        if self.final_fraction is None or self.online_steps <= 0:
            return self.offline_fraction
        progress = min(max(self.storage.size - self.dataset_size, 0) / self.online_steps, 1.0)
        return self.offline_fraction + (self.final_fraction - self.offline_fraction) * progress

    def update_priorities(self, indices: torch.Tensor, td_errors: torch.Tensor) -> None:
        self.storage.update_priorities(indices, td_errors)

    def state_dict(self) -> dict[str, Any]:
        s, n = self.storage, self.dataset_size
        return {"pos": s.pos, "size": s.size,
                **{k: getattr(s, k)[n:s.size].clone() for k in ("obs", "next_obs", "actions", "rewards", "discounts")}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        s, n = self.storage, self.dataset_size
        s.pos, s.size = int(state["pos"]), int(state["size"])
        for k in ("obs", "next_obs", "actions", "rewards", "discounts"):
            getattr(s, k)[n:s.size] = state[k].to(s.storage)
