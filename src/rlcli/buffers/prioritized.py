"""Prioritized experience replay (Schaul et al. 2016) and emphasizing recent experience (ERE).

P(i) = p_i^alpha / sum_k p_k^alpha with p_i = |TD error| + epsilon; new transitions get the largest
priority seen so far. Samples are stratified over the total priority mass; importance weights
(N P(i))^-beta, normalized by the batch maximum, correct the bias, with beta annealed to 1 over
the run. Algorithms call `update_priorities` after each gradient step.

ERE (Wang & Ross 2019): the k-th of K gradient steps of an update phase samples only from the most
recent c_k = max(N * eta^(k * 1000 / K), c_min) transitions, with eta annealed linearly to
`eta_final` over the run. `buffer=ere` is ERE with uniform sampling (alpha = 0 makes every priority
equal); `buffer=per buffer.eta=0.996` is ERE with prioritized sampling. Either takes `n_step`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlcli.batches import ReplayBatch
from rlcli.buffers.replay import REPLAY, ReplayBuffer, Storage, _replay_context
from rlcli.buffers.sumtree import SumTree
from rlcli.registry import BUFFERS, require
from rlcli.schedules import Schedule


class PrioritizedReplayBuffer(ReplayBuffer):
    def __init__(self, capacity: int, n_step: int, alpha: float, beta: float, beta_final: float,
                 epsilon: float, eta: float | None = None, eta_final: float = 1.0, c_min: int = 5000,
                 **context: Any) -> None:
        super().__init__(capacity, n_step, **context)
        require(eta is None or 0 < eta <= 1, "buffer.eta", eta, "must be in (0, 1] or null (no ERE)")
        require(0 < eta_final <= 1, "buffer.eta_final", eta_final, "must be in (0, 1]")
        require(c_min > 0, "buffer.c_min", c_min, "must be > 0")
        self.eta, self.c_min = eta, c_min
        require(alpha >= 0, "buffer.alpha", alpha, "must be >= 0")
        require(0 <= beta <= 1, "buffer.beta", beta, "must be in [0, 1]")
        require(0 <= beta_final <= 1, "buffer.beta_final", beta_final, "must be in [0, 1]")
        require(epsilon > 0, "buffer.epsilon", epsilon, "must be > 0")
        self.alpha, self.beta, self.epsilon = alpha, beta, epsilon
        # beta -> beta_final (and ERE's eta -> eta_final) over the run: schedules the trainer applies
        self.default_schedules = {"beta": Schedule("linear", beta, beta_final)}
        if eta is not None:
            self.default_schedules["eta"] = Schedule("linear", eta, eta_final)
        self.tree = SumTree(capacity)
        self.max_priority = 1.0

    def _on_write(self, where: np.ndarray) -> None:
        self.tree.update(where, np.full(where.shape[0], self.max_priority**self.alpha))

    def recent_window(self, step: int, steps: int) -> int:
        """How many of the newest transitions the `step`-th of `steps` gradient steps may sample (ERE)."""
        if self.eta is None:
            return self.size
        return int(min(self.size, max(self.size * self.eta ** (step * 1000 / max(steps, 1)), self.c_min)))

    def sample(self, batch_size: int, step: int = 0, steps: int = 1) -> ReplayBatch:
        window = self.recent_window(step, steps)
        start = (self.pos - window) % self.capacity  # the window is [start, pos) around the ring
        if window == self.size:  # everything stored
            first, offset, mass = 0.0, 0.0, self.tree.total
        elif start < self.pos:
            offset, first = self.tree.prefix(start), 0.0
            mass = self.tree.prefix(self.pos) - offset
        else:  # wraps: [start, capacity) then [0, pos)
            offset = self.tree.prefix(start)
            first = self.tree.total - offset
            mass = first + self.tree.prefix(self.pos)
        # stratified over the window's mass, with torch's generator so that a resumed run draws the same
        u = (np.arange(batch_size) + torch.rand(batch_size, dtype=torch.float64).numpy()) * (mass / batch_size)
        contiguous = window == self.size or start < self.pos
        values = offset + u if contiguous else np.where(u < first, offset + u, u - first)
        idx = np.minimum(self.tree.find(values), self.size - 1)
        probs = self.tree.get(idx) / mass
        weights = (window * probs) ** (-self.beta)
        weights /= weights.max()
        return self._batch(torch.as_tensor(idx), torch.as_tensor(weights, dtype=torch.float32))

    def update_priorities(self, indices: torch.Tensor, td_errors: torch.Tensor) -> None:
        priorities = td_errors.detach().abs().double().cpu().numpy() + self.epsilon
        self.max_priority = max(self.max_priority, float(priorities.max()))
        self.tree.update(indices.cpu().numpy(), priorities**self.alpha)

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"tree": self.tree.state_dict(), "max_priority": self.max_priority}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.tree.load_state_dict(state["tree"])
        self.max_priority = state["max_priority"]


@BUFFERS.register("per", spec=REPLAY)
def per(capacity: int = 1_000_000, n_step: int = 1, alpha: float = 0.6, beta: float = 0.4,
        beta_final: float = 1.0, epsilon: float = 1e-6, eta: float | None = None, eta_final: float = 1.0,
        c_min: int = 5000, storage: Storage = "auto", **context: Any) -> PrioritizedReplayBuffer:
    """Prioritized replay; with `n_step` > 1 n-step returns, with `eta` set ERE's recency window."""
    return PrioritizedReplayBuffer(capacity, n_step, alpha, beta, beta_final, epsilon, eta, eta_final, c_min,
                                   **_replay_context(context), storage=storage)


@BUFFERS.register("ere", spec=REPLAY)
def ere(capacity: int = 1_000_000, n_step: int = 1, eta: float = 0.996, eta_final: float = 1.0,
        c_min: int = 5000, alpha: float = 0.0, beta: float = 0.4, beta_final: float = 1.0, epsilon: float = 1e-6,
        storage: Storage = "auto", **context: Any) -> PrioritizedReplayBuffer:
    """Emphasizing recent experience; uniform within the window unless `alpha` > 0 (then ERE with PER)."""
    return PrioritizedReplayBuffer(capacity, n_step, alpha, beta, beta_final, epsilon, eta, eta_final, c_min,
                                   **_replay_context(context), storage=storage)


