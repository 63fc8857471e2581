"""Running mean/std observation normalization that lives inside the agent.

Collection updates it; testing and evaluation use it frozen. Its statistics are module buffers, so
they travel with the actor's state_dict into every checkpoint.
"""

from __future__ import annotations

import torch
from torch import nn


class RunningNorm(nn.Module):
    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, enabled: bool = True, eps: float = 1e-8):
        super().__init__()
        self.enabled = enabled
        self.clip = clip
        self.eps = eps
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    @torch.no_grad()
    def update(self, batch: torch.Tensor) -> None:
        """Merge a batch's moments into the running ones (parallel variance formula)."""
        if not self.enabled:
            return
        batch = batch.reshape(-1, *self.mean.shape).to(torch.float64)
        b_mean, b_var, b_count = batch.mean(0), batch.var(0, unbiased=False), batch.shape[0]
        delta = b_mean - self.mean
        total = self.count + b_count
        self.mean += delta * b_count / total
        m2 = self.var * self.count + b_var * b_count + delta.square() * self.count * b_count / total
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return obs
        scale = torch.rsqrt(self.var + self.eps).to(obs.dtype)
        return ((obs - self.mean.to(obs.dtype)) * scale).clamp(-self.clip, self.clip)
