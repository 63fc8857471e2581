"""Networks for off-policy algorithms, built from the actor config's torso settings.

The actor config (`actor=mlp`) describes the torso (sizes, activation, init); each off-policy
algorithm asks for the heads it needs: Q-values per discrete action (optionally dueling), a
deterministic tanh policy, a tanh-squashed Gaussian policy, and N critics Q(s, a).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from rlcli.actors.mlp import Activation, mlp, orthogonal_init
from rlcli.actors.normalizer import RunningNorm

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # SAC's usual clamp of the policy's log std


@dataclass
class Torso:
    """How to build one network body; `normalizer` is shared by every network of the agent."""

    obs_dim: int
    hidden_sizes: list[int]
    activation: Activation
    ortho_init: bool
    normalizer: RunningNorm

    def make(self, in_features: int, out_features: int, out_gain: float = 1.0) -> nn.Sequential:
        body = mlp(in_features, self.hidden_sizes, self.activation)
        last = nn.Linear(self.hidden_sizes[-1] if self.hidden_sizes else in_features, out_features)
        if self.ortho_init:
            orthogonal_init(body, math.sqrt(2))
            orthogonal_init(last, out_gain)
        return nn.Sequential(*body, last)


class QNetwork(nn.Module):
    """Q-values of every discrete action; dueling splits them into V(s) + A(s, a) - mean A."""

    def __init__(self, torso: Torso, n_actions: int, dueling: bool):
        super().__init__()
        self.dueling = dueling
        if dueling:
            self.body = torso.make(torso.obs_dim, torso.hidden_sizes[-1]) if torso.hidden_sizes else nn.Identity()
            width = torso.hidden_sizes[-1] if torso.hidden_sizes else torso.obs_dim
            self.value = nn.Linear(width, 1)
            self.advantage = nn.Linear(width, n_actions)
        else:
            self.q = torso.make(torso.obs_dim, n_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if not self.dueling:
            return self.q(obs)
        h = torch.relu(self.body(obs))
        adv = self.advantage(h)
        return self.value(h) + adv - adv.mean(-1, keepdim=True)


class Critics(nn.Module):
    """N independent Q(s, a) networks evaluated together: returns [N, batch]."""

    def __init__(self, torso: Torso, action_dim: int, n: int):
        super().__init__()
        self.nets = nn.ModuleList(torso.make(torso.obs_dim + action_dim, 1) for _ in range(n))

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        x = torch.cat([obs, actions], -1)
        return torch.stack([net(x).squeeze(-1) for net in self.nets])


class DeterministicPolicy(nn.Module):
    """a = tanh(f(s)) in [-1, 1]; the algorithm rescales to the env's bounds."""

    def __init__(self, torso: Torso, action_dim: int):
        super().__init__()
        self.net = torso.make(torso.obs_dim, action_dim, out_gain=0.01)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(obs))


class SquashedGaussianPolicy(nn.Module):
    """a = tanh(u), u ~ N(mean(s), std(s)); log-probs include the tanh change of variables."""

    def __init__(self, torso: Torso, action_dim: int):
        super().__init__()
        self.net = torso.make(torso.obs_dim, 2 * action_dim, out_gain=0.01)

    def forward(self, obs: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.net(obs).chunk(2, -1)
        log_std = log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
        if deterministic:
            return torch.tanh(mean), torch.zeros(mean.shape[:-1], device=mean.device)
        noise = torch.randn_like(mean)
        u = mean + log_std.exp() * noise
        action = torch.tanh(u)
        log_prob = (-0.5 * noise.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        # log|d tanh(u)/du| = 2 (log 2 - u - softplus(-2u)), numerically stable
        log_prob = log_prob - (2 * (math.log(2) - u - nn.functional.softplus(-2 * u))).sum(-1)
        return action, log_prob
