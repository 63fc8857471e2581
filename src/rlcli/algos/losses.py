"""Losses that more than one algorithm uses, each tested once against its definition
(tests/test_distributional.py): the quantile regression loss of QR-DQN and TQC."""

from __future__ import annotations

import torch


def quantile_huber_loss(quantiles: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-sample quantile regression loss with the Huber kappa = 1 (Dabney et al. 2018).

    quantiles [..., B, Q] at the midpoints tau_i = (i + 0.5) / Q; targets [B, T] samples of the target
    distribution. Summed over the predicted quantiles, averaged over the targets (and any leading dims):
    returns [B].
    """
    n = quantiles.shape[-1]
    tau = (torch.arange(n, device=quantiles.device, dtype=quantiles.dtype) + 0.5) / n
    delta = targets.unsqueeze(-2) - quantiles.unsqueeze(-1)  # [..., B, Q, T]
    abs_delta = delta.abs()
    huber = torch.where(abs_delta <= 1.0, 0.5 * delta.square(), abs_delta - 0.5)
    loss = (tau.unsqueeze(-1) - (delta.detach() < 0).to(quantiles.dtype)).abs() * huber
    per_sample = loss.sum(-2).mean(-1)  # [..., B]
    return per_sample.reshape(-1, per_sample.shape[-1]).mean(0)
