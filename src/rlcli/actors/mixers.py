"""Value decomposition's mixers: a team's Q from its agents' (algos/value_decomposition.py).

`QMixer` is QMIX's monotonic mixing network (Rashid et al. 2018): a one-hidden-layer network over the agents' Qs whose
weights hypernetworks make from the global state and keep non-negative (abs), so that dQ_tot/dQ_i >= 0 and each agent's
greedy action is the team's. Sizes as PyMARL's defaults: embed 32, the weights' hypernetworks with a hidden layer of
64 (`hypernet_layers=2`); `hypernet_layers=1` makes each of them one linear layer, as torchrl's QMixer (BenchMARL's).
Given the state's bounds (`state_bounds`), the mixer reads each bounded entry rescaled to [-1, 1]: an unnormalized
state (LBF's grid positions 0-7 and levels) otherwise makes the hypernetworks' first weights, and Q_tot, large.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

# a wider span is an env's way of saying "unbounded" (float32's max, 1e30): rescaled, its values would all read ~0
WIDEST_SCALED_SPAN = 1e6


def rescalable(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Which state entries the mixer rescales: both bounds finite, high > low, and a span an env means."""
    low, high = np.asarray(low, np.float64), np.asarray(high, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        span = high - low
    ok: np.ndarray = np.isfinite(span) & (span > 0) & (span <= WIDEST_SCALED_SPAN)
    return ok


class QMixer(nn.Module):
    state_offset: torch.Tensor
    state_scale: torch.Tensor

    def __init__(self, n_agents: int, state_size: int, embed_dim: int = 32, hypernet_hidden: int = 64,
                 hypernet_layers: int = 2, state_bounds: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        super().__init__()
        self.n_agents, self.embed_dim = n_agents, embed_dim
        offset, scale = np.zeros(state_size, np.float32), np.ones(state_size, np.float32)
        if state_bounds is not None:
            low, high = (np.asarray(b, np.float64).reshape(-1) for b in state_bounds)
            bounded = rescalable(low, high)
            offset[bounded] = (high[bounded] + low[bounded]) / 2
            scale[bounded] = 2 / (high[bounded] - low[bounded])
        # derived from the env's spaces, not learned: kept out of checkpoints (persistent=False)
        self.register_buffer("state_offset", torch.from_numpy(offset), persistent=False)
        self.register_buffer("state_scale", torch.from_numpy(scale), persistent=False)

        def hypernet(out: int) -> nn.Module:
            """The state's map to `out` mixing weights: one linear layer, or two with a ReLU between."""
            if hypernet_layers == 1:
                return nn.Linear(state_size, out)
            return nn.Sequential(nn.Linear(state_size, hypernet_hidden), nn.ReLU(), nn.Linear(hypernet_hidden, out))

        self.hyper_w1 = hypernet(n_agents * embed_dim)
        self.hyper_b1 = nn.Linear(state_size, embed_dim)
        self.hyper_w2 = hypernet(embed_dim)
        self.value = nn.Sequential(nn.Linear(state_size, embed_dim), nn.ReLU(), nn.Linear(embed_dim, 1))  # V(s)

    def forward(self, qs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """Q_tot [...] of the agents' Qs [..., n_agents] in the global state [..., state_size]."""
        state = (state - self.state_offset) * self.state_scale
        w1 = self.hyper_w1(state).abs().unflatten(-1, (self.n_agents, self.embed_dim))  # [..., N, E]
        hidden = nn.functional.elu((qs.unsqueeze(-2) @ w1).squeeze(-2) + self.hyper_b1(state))  # [..., E]
        w2 = self.hyper_w2(state).abs()  # [..., E]
        value: torch.Tensor = self.value(state)
        total: torch.Tensor = (hidden * w2).sum(-1) + value.squeeze(-1)
        return total
