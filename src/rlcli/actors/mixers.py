"""Value decomposition's mixers: a team's Q from its agents' (algos/value_decomposition.py).

`QMixer` is QMIX's monotonic mixing network (Rashid et al. 2018): a one-hidden-layer network over the agents' Qs whose
weights hypernetworks make from the global state and keep non-negative (abs), so that dQ_tot/dQ_i >= 0 and each agent's
greedy action is the team's. Sizes as PyMARL's defaults: embed 32, the weights' hypernetworks with a hidden layer of
64 (`hypernet_layers=2`); `hypernet_layers=1` makes each of them one linear layer, as torchrl's QMixer (BenchMARL's).
"""

from __future__ import annotations

import torch
from torch import nn


class QMixer(nn.Module):
    def __init__(self, n_agents: int, state_size: int, embed_dim: int = 32, hypernet_hidden: int = 64,
                 hypernet_layers: int = 2) -> None:
        super().__init__()
        self.n_agents, self.embed_dim = n_agents, embed_dim

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
        w1 = self.hyper_w1(state).abs().unflatten(-1, (self.n_agents, self.embed_dim))  # [..., N, E]
        hidden = nn.functional.elu((qs.unsqueeze(-2) @ w1).squeeze(-2) + self.hyper_b1(state))  # [..., E]
        w2 = self.hyper_w2(state).abs()  # [..., E]
        value: torch.Tensor = self.value(state)
        total: torch.Tensor = (hidden * w2).sum(-1) + value.squeeze(-1)
        return total
