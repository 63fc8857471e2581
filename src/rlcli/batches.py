"""What a storage hands an update: the batch of each storage kind, as named tuples of tensors.

They live apart from the storages so that the contracts (contracts.py) can name them without importing a
storage, which registers itself and imports the contracts.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class RolloutBatch(NamedTuple):
    obs: torch.Tensor
    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    mask: torch.Tensor  # 1 for real transitions, 0 for reset steps
    # Recurrent actors only: [T, B] episode starts and each env's carry when the rollout began.
    # The other fields are then time-major flat [T * B] over those B envs.
    starts: torch.Tensor | None = None
    carry0: torch.Tensor | None = None
    action_masks: torch.Tensor | None = None  # algorithms with AlgoSpec.action_masks: [.., n_actions] bool


class ReplayBatch(NamedTuple):
    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    next_obs: torch.Tensor
    discounts: torch.Tensor
    weights: torch.Tensor  # importance weights (ones unless prioritized)
    indices: torch.Tensor


class SequenceBatch(NamedTuple):
    """Time-major: obs and starts [L + 1, B, ...]; actions [L, B, ...]; rewards, terminated, valid [L, B];
    carry0 [B, C]; the first `burn_in` steps only warm the carry up (a number, not a tensor: a compiled loss takes
    it as a constant of its graph)."""

    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    terminated: torch.Tensor
    valid: torch.Tensor
    starts: torch.Tensor
    carry0: torch.Tensor
    burn_in: int
