"""Exploration and minibatch order shared by the algorithms: each draws from torch's global generator in
the same order as before it was shared, so runs (and exact resume) are unchanged."""

from __future__ import annotations

from collections.abc import Iterator

import torch


def epsilon_greedy(greedy: torch.Tensor, n_actions: int, epsilon: float) -> torch.Tensor:
    """Each greedy action replaced, with probability `epsilon`, by a uniformly random one (DQN, PQN). Which actions
    explore, then their replacements, are drawn on the CPU (the generator a checkpoint saves)."""
    explore, random = torch.rand(greedy.shape) < epsilon, torch.randint(0, n_actions, greedy.shape)
    return torch.where(explore.to(greedy.device), random.to(greedy.device), greedy)


def uniform_box_actions(n: int, action_dim: int) -> torch.Tensor:
    """Warm-up actions of continuous-control algorithms: uniform in [-1, 1] (BoxScaler maps them to the env)."""
    return torch.rand(n, action_dim) * 2 - 1


def minibatches(size: int, batch_size: int, device: torch.device | str) -> Iterator[torch.Tensor]:
    """Indices of a random permutation of `size` items in chunks of `batch_size` (the last may be shorter)."""
    yield from torch.randperm(size, device=device).split(batch_size)
