"""Prioritized experience replay (Schaul et al. 2016), with n-step returns if asked.

P(i) = p_i^alpha / sum_k p_k^alpha with p_i = |TD error| + epsilon; new transitions get the largest
priority seen so far. Samples are stratified over the total priority mass; importance weights
(N P(i))^-beta, normalized by the batch maximum, correct the bias, with beta annealed to 1 over
the run. Algorithms call `update_priorities` after each gradient step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlcli.buffers.replay import ReplayBatch, ReplayBuffer, _replay_context
from rlcli.buffers.sumtree import SumTree
from rlcli.registry import BUFFERS, require


class PrioritizedReplayBuffer(ReplayBuffer):
    def __init__(self, capacity: int, n_step: int, alpha: float, beta: float, beta_final: float,
                 epsilon: float, **context: Any) -> None:
        super().__init__(capacity, n_step, **context)
        require(alpha >= 0, "buffer.alpha", alpha, "must be >= 0")
        require(0 <= beta <= 1, "buffer.beta", beta, "must be in [0, 1]")
        require(0 <= beta_final <= 1, "buffer.beta_final", beta_final, "must be in [0, 1]")
        require(epsilon > 0, "buffer.epsilon", epsilon, "must be > 0")
        self.alpha, self.beta, self.beta_final, self.epsilon = alpha, beta, beta_final, epsilon
        self.tree = SumTree(capacity)
        self.max_priority = 1.0

    def _on_write(self, idx: torch.Tensor) -> None:
        self.tree.update(idx.cpu().numpy(), np.full(idx.shape[0], self.max_priority**self.alpha))

    def sample(self, batch_size: int, progress: float = 0.0) -> ReplayBatch:
        total = self.tree.total
        segment = total / batch_size
        # torch's generator, so that a resumed run draws the same samples
        u = torch.rand(batch_size, dtype=torch.float64).numpy()
        idx = self.tree.find((np.arange(batch_size) + u) * segment)
        idx = np.minimum(idx, self.size - 1)
        probs = self.tree.get(idx) / total
        beta = self.beta + (self.beta_final - self.beta) * min(1.0, progress)
        weights = (self.size * probs) ** (-beta)
        weights /= weights.max()
        index = torch.as_tensor(idx, device=self.device)
        return self._batch(index, torch.as_tensor(weights, dtype=torch.float32, device=self.device))

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


@BUFFERS.register("per")
def per(capacity: int = 1_000_000, n_step: int = 1, alpha: float = 0.6, beta: float = 0.4,
        beta_final: float = 1.0, epsilon: float = 1e-6, **context: Any) -> PrioritizedReplayBuffer:
    """Prioritized replay; combine with n-step returns through `buffer.n_step`."""
    return PrioritizedReplayBuffer(capacity, n_step, alpha, beta, beta_final, epsilon, **_replay_context(context))


per.on_policy = False  # type: ignore[attr-defined]
