"""Hindsight experience replay (Andrychowicz et al. 2017) for goal-conditioned envs.

Observations arrive flattened (observation, achieved_goal, desired_goal concatenated); the env's
GoalLayout says where the goals sit. An episode's transitions are stored when it ends, each with the
ring positions of its episode's first and last transition. At sample time a fraction k / (k + 1) of
the batch gets a new desired goal, an achieved goal from the same episode (`future`: this step or
later, `final`: the last step, `episode`: any step), and the env's own `compute_reward` (and
`compute_terminated`, where the env has it) recomputes reward and termination for that goal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import torch

from rlcli.batches import ReplayBatch
from rlcli.buffers.replay import REPLAY, identity
from rlcli.registry import BUFFERS, ConfigError, require
from rlcli.schedules import Schedule


class HerReplayBuffer:
    def __init__(self, capacity: int, k: int, strategy: Literal["future", "final", "episode"], num_envs: int,
                 obs_shape: tuple[int, ...], action_shape: tuple[int, ...], discrete: bool,
                 device: torch.device, gamma: float, goal: Any,
                 normalizer: Callable[[torch.Tensor], torch.Tensor] = identity) -> None:
        require(capacity > 0, "buffer.capacity", capacity, "must be > 0")
        require(k >= 0, "buffer.k", k, "must be >= 0")
        self.capacity, self.k, self.strategy, self.gamma, self.device, self.goal = (
            capacity, k, strategy, gamma, device, goal)
        self.normalizer = normalizer
        self.default_schedules: dict[str, Schedule] = {}
        self.obs = np.zeros((capacity, *obs_shape), np.float32)
        self.next_obs = np.zeros((capacity, *obs_shape), np.float32)
        self.actions = np.zeros((capacity, *action_shape), np.int64 if discrete else np.float32)
        self.rewards = np.zeros(capacity, np.float32)
        self.terminated = np.zeros(capacity, np.float32)
        self.ep_start = np.zeros(capacity, np.int64)  # absolute write counts of the episode's first ...
        self.ep_end = np.zeros(capacity, np.int64)  # ... and last transition
        self.written = 0  # absolute number of transitions ever written
        self.size = 0
        self.pending: list[list[tuple]] = [[] for _ in range(num_envs)]

    def __len__(self) -> int:
        return self.size

    def add(self, obs: torch.Tensor, actions: torch.Tensor, rewards: np.ndarray, next_obs: np.ndarray,
            terminated: np.ndarray, dones: np.ndarray, valid: np.ndarray) -> None:
        obs_np, actions_np = obs.cpu().numpy(), actions.cpu().numpy()
        for i in np.flatnonzero(valid):
            self.pending[i].append((obs_np[i], actions_np[i], rewards[i], next_obs[i], terminated[i]))
            if dones[i]:
                self._write_episode(self.pending[i])
                self.pending[i] = []

    def envs_reset(self, rows: list[int]) -> None:
        """These envs were reset in mid-episode (a resume that could not restore them, a restarted Ray worker): the
        episode each was gathering ends here, as if truncated (its goals are relabelled within what it has)."""
        for i in rows:
            if self.pending[i]:
                self._write_episode(self.pending[i])
            self.pending[i] = []

    def _write_episode(self, steps: list[tuple]) -> None:
        n = len(steps)
        start = self.written
        pos = (start + np.arange(n)) % self.capacity
        o, a, r, no, t = (np.stack(x) for x in zip(*steps, strict=True))
        self.obs[pos], self.actions[pos], self.rewards[pos], self.next_obs[pos], self.terminated[pos] = o, a, r, no, t
        self.ep_start[pos], self.ep_end[pos] = start, start + n - 1
        self.written += n
        self.size = min(self.size + n, self.capacity)

    def update_priorities(self, indices: torch.Tensor, td_errors: torch.Tensor) -> None:
        """Uniform sampling keeps no priorities: nothing to update (buffer=per overrides this)."""

    def sample(self, batch_size: int, step: int = 0, steps: int = 1) -> ReplayBatch:
        if self.size == 0:
            raise ConfigError("buffer=her has no complete episode yet: raise algo.learning_starts")
        idx = torch.randint(0, self.size, (batch_size,)).numpy()
        obs, next_obs = self.obs[idx].copy(), self.next_obs[idx].copy()
        rewards, terminated = self.rewards[idx].copy(), self.terminated[idx].copy()
        relabel = torch.rand(batch_size).numpy() < self.k / (self.k + 1)
        if relabel.any():
            j = idx[relabel]
            absolute = self.written - self.size + (j - (self.written - self.size)) % self.capacity
            oldest = self.written - self.size
            start, end = np.maximum(self.ep_start[j], oldest), self.ep_end[j]
            u = torch.rand(len(j), dtype=torch.float64).numpy()
            if self.strategy == "future":
                pick = absolute + np.floor(u * (end - absolute + 1)).astype(np.int64)
            elif self.strategy == "final":
                pick = end
            else:
                pick = start + np.floor(u * (end - start + 1)).astype(np.int64)
            goals = self.next_obs[pick % self.capacity][:, self.goal.achieved]
            obs[relabel, self.goal.desired] = goals
            next_obs[relabel, self.goal.desired] = goals
            achieved = next_obs[relabel][:, self.goal.achieved]
            rewards[relabel] = self.goal.compute_reward(achieved, goals, {})
            if self.goal.compute_terminated is not None:
                terminated[relabel] = self.goal.compute_terminated(achieved, goals, {})

        def t(x: np.ndarray) -> torch.Tensor:
            return torch.as_tensor(x, device=self.device)

        discounts = self.gamma * (1.0 - terminated)
        return ReplayBatch(self.normalizer(t(obs)), t(self.actions[idx]), t(rewards), self.normalizer(t(next_obs)),
                           t(discounts.astype(np.float32)),
                           torch.ones(batch_size, device=self.device), t(idx))

    def state_dict(self) -> dict[str, Any]:
        arrays = ("obs", "next_obs", "actions", "rewards", "terminated", "ep_start", "ep_end")
        return {"written": self.written, "size": self.size, "pending": self.pending,
                **{k: getattr(self, k)[: self.size].copy() for k in arrays}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.written, self.size, self.pending = state["written"], state["size"], state["pending"]
        for k in ("obs", "next_obs", "actions", "rewards", "terminated", "ep_start", "ep_end"):
            getattr(self, k)[: self.size] = state[k]


@BUFFERS.register("her", spec=REPLAY)
def her(capacity: int = 1_000_000, k: int = 4, strategy: Literal["future", "final", "episode"] = "future",
        **context: Any) -> HerReplayBuffer:
    """Hindsight relabeling with `k` relabeled transitions per real one."""
    goal = context.get("goal")
    if goal is None:
        raise ConfigError(
            "buffer=her needs a goal-conditioned env: Dict observations with observation, achieved_goal and "
            "desired_goal, a compute_reward method, and sync vector envs (e.g. env=BitFlipping-v0)"
        )
    keys = ("num_envs", "obs_shape", "action_shape", "discrete", "device", "gamma")
    return HerReplayBuffer(capacity, k, strategy, goal=goal, normalizer=context.get("normalizer", identity),
                           **{key: context[key] for key in keys})


