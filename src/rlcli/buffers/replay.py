"""Off-policy replay storage: uniform (`replay`) and n-step (`nstep`) in one preallocated ring.

Each stored transition carries its own discount: gamma^k for a k-step return that ends in a
bootstrap, 0 when the episode terminated inside it. Algorithms then use one formula,
`target = reward + discount * Q(next_obs)`, whatever n is. With NEXT_STEP autoreset the step that
ends an episode returns the true final observation, so a truncated episode bootstraps from it; the
following reset step is not a transition and is never stored.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from rlcli.registry import BUFFERS, require


class ReplayBatch(NamedTuple):
    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    next_obs: torch.Tensor
    discounts: torch.Tensor
    weights: torch.Tensor  # importance weights (ones unless prioritized)
    indices: torch.Tensor


class ReplayBuffer:
    """Preallocated circular storage on the training device; memory is flat once full."""

    on_policy = False

    def __init__(
        self,
        capacity: int,
        n_step: int,
        num_envs: int,
        obs_shape: tuple[int, ...],
        action_shape: tuple[int, ...],
        discrete: bool,
        device: torch.device,
        gamma: float,
    ) -> None:
        require(capacity > 0, "buffer.capacity", capacity, "must be > 0")
        require(n_step > 0, "buffer.n_step", n_step, "must be >= 1")
        self.capacity, self.n_step, self.gamma, self.device = capacity, n_step, gamma, device
        self.num_envs = num_envs
        self.obs = torch.zeros(capacity, *obs_shape, device=device)
        self.next_obs = torch.zeros(capacity, *obs_shape, device=device)
        self.actions = torch.zeros(capacity, *action_shape, device=device,
                                   dtype=torch.long if discrete else torch.float32)
        self.rewards = torch.zeros(capacity, device=device)
        self.discounts = torch.zeros(capacity, device=device)
        self.pos = 0
        self.size = 0
        # n-step: per env, the (obs, action, reward) of steps whose return is not complete yet
        self.pending: list[list[tuple[Any, Any, float]]] = [[] for _ in range(num_envs)]

    def __len__(self) -> int:
        return self.size

    def add(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor,
        rewards: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
        dones: np.ndarray,
        valid: np.ndarray,
    ) -> None:
        """One step of the vector env. `valid` is False for reset steps, which are skipped."""
        if self.n_step == 1:
            keep = torch.as_tensor(valid, device=self.device)
            discounts = self.gamma * (1.0 - terminated.astype(np.float32))
            self._write(obs[keep], actions[keep], self._t(rewards)[keep], self._t(next_obs)[keep],
                        self._t(discounts)[keep])
            return
        out: list[tuple[Any, Any, float, Any, float]] = []
        for i in np.flatnonzero(valid):
            pending = self.pending[i]
            pending.append((obs[i], actions[i], float(rewards[i])))
            if dones[i]:
                while pending:  # flush: shorter returns that end at the episode's end
                    out.append(self._n_step_transition(pending, next_obs[i], bool(terminated[i])))
                    pending.pop(0)
            elif len(pending) == self.n_step:
                out.append(self._n_step_transition(pending, next_obs[i], False))
                pending.pop(0)
        if out:
            o, a, r, n, d = zip(*out, strict=True)
            self._write(torch.stack(o), torch.stack(a), self._t(np.array(r)), self._t(np.stack(n)),
                        self._t(np.array(d)))

    def _n_step_transition(self, pending: list, next_obs: np.ndarray, terminated: bool) -> tuple:
        ret = sum(self.gamma**j * r for j, (_, _, r) in enumerate(pending))
        discount = 0.0 if terminated else self.gamma ** len(pending)
        return pending[0][0], pending[0][1], ret, next_obs, discount

    def _t(self, x: Any) -> torch.Tensor:
        return torch.as_tensor(x, dtype=torch.float32, device=self.device)

    def _write(self, obs, actions, rewards, next_obs, discounts) -> torch.Tensor:
        n = obs.shape[0]
        if n == 0:  # every env was on a reset step
            return torch.empty(0, dtype=torch.long, device=self.device)
        idx = (self.pos + torch.arange(n, device=self.device)) % self.capacity
        self.obs[idx], self.actions[idx], self.rewards[idx] = obs, actions, rewards
        self.next_obs[idx], self.discounts[idx] = next_obs, discounts
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)
        self._on_write(idx)
        return idx

    def _on_write(self, idx: torch.Tensor) -> None:
        """Hook for prioritized replay (new transitions get the maximum priority)."""

    def _batch(self, idx: torch.Tensor, weights: torch.Tensor | None = None) -> ReplayBatch:
        w = torch.ones(idx.shape[0], device=self.device) if weights is None else weights
        return ReplayBatch(self.obs[idx], self.actions[idx], self.rewards[idx], self.next_obs[idx],
                           self.discounts[idx], w, idx)

    def sample(self, batch_size: int, progress: float = 0.0, step: int = 0, steps: int = 1) -> ReplayBatch:
        """A uniform batch; `progress`, `step` and `steps` (k of K in an update phase) are for PER / ERE."""
        idx = torch.randint(0, self.size, (batch_size,), device=self.device)
        return self._batch(idx)

    def state_dict(self) -> dict[str, Any]:
        n = self.size
        return {"pos": self.pos, "size": n, "pending": self.pending,
                **{k: getattr(self, k)[:n].clone() for k in ("obs", "next_obs", "actions", "rewards", "discounts")}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pos, self.size, self.pending = state["pos"], state["size"], state["pending"]
        for k in ("obs", "next_obs", "actions", "rewards", "discounts"):
            getattr(self, k)[: self.size] = state[k].to(self.device)


@BUFFERS.register("replay")
def replay(capacity: int = 1_000_000, n_step: int = 1, **context: Any) -> ReplayBuffer:
    """Uniform replay; `n_step` > 1 stores n-step returns."""
    return ReplayBuffer(capacity, n_step, **_replay_context(context))


@BUFFERS.register("nstep")
def nstep(capacity: int = 1_000_000, n_step: int = 3, **context: Any) -> ReplayBuffer:
    """Uniform replay of n-step returns (n-step Q-learning targets)."""
    return ReplayBuffer(capacity, n_step, **_replay_context(context))


def _replay_context(context: dict[str, Any]) -> dict[str, Any]:
    keys = ("num_envs", "obs_shape", "action_shape", "discrete", "device", "gamma")
    return {k: context[k] for k in keys}


replay.on_policy = nstep.on_policy = False  # type: ignore[attr-defined]
