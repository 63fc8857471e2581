"""Losses that more than one algorithm uses, each tested once against its definition: the policy-gradient
losses (plain: A2C, PG; clipped: PPO), the value loss (A2C, PG, PPO; clipped: PPO2) in
tests/test_ppo_losses.py, and the quantile regression loss of QR-DQN and TQC in
tests/test_distributional.py. Every mean is over real steps (`mask`: padding of recurrent sequences is 0)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rlcli.algos.addons import addon_losses
from rlcli.algos.base import evaluate_batch, masked_mean, normalize_masked
from rlcli.batches import RolloutBatch


def policy_gradient_loss(advantages: torch.Tensor, log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """REINFORCE / A2C: -mean(A log pi(a|s))."""
    return -masked_mean(advantages * log_probs, mask)


def clipped_surrogate_loss(advantages: torch.Tensor, ratio: torch.Tensor, clip: float | None,
                           mask: torch.Tensor) -> torch.Tensor:
    """PPO's policy loss: mean of max(-A r, -A clip(r, 1 - c, 1 + c)) over real steps; with `clip` None
    the unclipped surrogate -A r (ppo_kl)."""
    if clip is None:
        return -masked_mean(advantages * ratio, mask)
    return masked_mean(torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1 - clip, 1 + clip)), mask)


def squared_value_loss(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
                       old_values: torch.Tensor | None = None, clip_vf: float | None = None) -> torch.Tensor:
    """Mean squared error to the returns over real steps (A2C, PG's baseline, PPO); with `clip_vf`, the larger
    of it and the error of the prediction clipped to old +- clip_vf (PPO2's value clipping). Several value
    heads (rnd_ppo): their sum."""
    value_error = (values - returns).square()
    if clip_vf is not None:
        assert old_values is not None, "value clipping needs the rollout's values"
        clipped = old_values + (values - old_values).clamp(-clip_vf, clip_vf)
        value_error = torch.maximum(value_error, (clipped - returns).square())
    if value_error.dim() > mask.dim():
        value_error = value_error.sum(-1)
    return masked_mean(value_error, mask)



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


def policy_gradient_terms(networks: Any, batch: RolloutBatch, addons: Sequence[Any], normalize_advantage: bool,
                          addon_coefs: Sequence[Any] | None = None,
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """A2C's and PG's shared part: the policy-gradient loss (with add-on terms), the mean entropy, the values
    and the add-ons' logs of one rollout batch (`addon_coefs`: see addons.addon_losses)."""
    mask = batch.mask
    log_probs, entropy, values = evaluate_batch(networks, batch)
    advantages = batch.advantages
    if normalize_advantage:
        advantages = normalize_masked(advantages, mask)
    policy_loss = policy_gradient_loss(advantages, log_probs, mask)
    extra, addon_logs = addon_losses(list(addons), networks, batch.obs, mask, addon_coefs)
    return policy_loss + extra, masked_mean(entropy, mask), values, addon_logs
