"""Action distributions written as plain tensor math.

Building torch.distributions objects on every acting step costs more than the small networks do;
these functions give the same log-probabilities and entropies (tests check them against
torch.distributions) without the objects.
"""

from __future__ import annotations

import math

import torch
from torch import nn

_LOG_2PI = math.log(2 * math.pi)


class CategoricalHead(nn.Module):
    """Discrete actions: logits from a linear layer."""

    def __init__(self, in_features: int, n_actions: int):
        super().__init__()
        self.logits = nn.Linear(in_features, n_actions)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.logits(features), dim=-1)

    @staticmethod
    def sample(log_probs: torch.Tensor, deterministic: bool, uniforms: torch.Tensor | None = None) -> torch.Tensor:
        """`uniforms`: `draw`'s numbers, drawn beforehand (a population draws each member's from its own stream,
        then samples for all members in one call; elementwise, so each member's actions are its own draws')."""
        if deterministic:
            return log_probs.argmax(-1)
        if uniforms is None:
            uniforms = CategoricalHead.draw(log_probs)
        # Gumbel-max: argmax(logp + Gumbel noise) is a sample of the categorical distribution.
        gumbel = -torch.log(-torch.log(uniforms.clamp_min(1e-20)))
        return (log_probs + gumbel).argmax(-1)

    @staticmethod
    def draw(log_probs: torch.Tensor) -> torch.Tensor:
        """The random numbers `sample` takes, one uniform per action and state, from torch's generator."""
        return torch.rand_like(log_probs)

    @staticmethod
    def log_prob(log_probs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)

    @staticmethod
    def entropy(log_probs: torch.Tensor) -> torch.Tensor:
        return -(log_probs.exp() * log_probs).sum(-1)

    @staticmethod
    def kl(p_log_probs: torch.Tensor, q_log_probs: torch.Tensor, p_head: nn.Module | None = None) -> torch.Tensor:
        """KL(p || q) per state, from both distributions' log-probabilities."""
        return (p_log_probs.exp() * (p_log_probs - q_log_probs)).sum(-1)


class MultiCategoricalHead(nn.Module):
    """MultiDiscrete actions: independent categoricals, one per entry; the log-prob and entropy are the entries'
    sums. The head's output is every entry's log-probabilities side by side, [B, sum(nvec)]."""

    def __init__(self, in_features: int, nvec: list[int]):
        super().__init__()
        self.nvec = [int(n) for n in nvec]
        self.logits = nn.Linear(in_features, sum(self.nvec))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.log_softmax(x, dim=-1) for x in self.logits(features).split(self.nvec, dim=-1)], -1)

    def sample(self, log_probs: torch.Tensor, deterministic: bool) -> torch.Tensor:
        """[B, entries] as floats (stored with the Box actions' storage; `log_prob` takes them back as indices)."""
        return torch.stack([CategoricalHead.sample(x, deterministic) for x in log_probs.split(self.nvec, dim=-1)],
                           -1).float()

    def log_prob(self, log_probs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        entries = log_probs.split(self.nvec, dim=-1)
        return torch.stack([CategoricalHead.log_prob(x, actions[..., i]) for i, x in enumerate(entries)], -1).sum(-1)

    def entropy(self, log_probs: torch.Tensor) -> torch.Tensor:
        return -(log_probs.exp() * log_probs).sum(-1)  # the entries' entropies, summed

    def kl(self, p_log_probs: torch.Tensor, q_log_probs: torch.Tensor, p_head: nn.Module | None = None) -> torch.Tensor:
        return (p_log_probs.exp() * (p_log_probs - q_log_probs)).sum(-1)  # the entries' KLs, summed


class BernoulliHead(nn.Module):
    """MultiBinary actions: an independent Bernoulli per entry. The head's output is each entry's logit."""

    def __init__(self, in_features: int, n: int):
        super().__init__()
        self.logits = nn.Linear(in_features, n)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.logits(features)

    @staticmethod
    def sample(logits: torch.Tensor, deterministic: bool) -> torch.Tensor:
        if deterministic:
            return (logits > 0).float()
        return (torch.rand_like(logits) < torch.sigmoid(logits)).float()

    @staticmethod
    def log_prob(logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return -nn.functional.binary_cross_entropy_with_logits(logits, actions, reduction="none").sum(-1)

    @staticmethod
    def entropy(logits: torch.Tensor) -> torch.Tensor:
        p = torch.sigmoid(logits)
        return nn.functional.binary_cross_entropy_with_logits(logits, p, reduction="none").sum(-1)

    @staticmethod
    def kl(p_logits: torch.Tensor, q_logits: torch.Tensor, p_head: nn.Module | None = None) -> torch.Tensor:
        p = torch.sigmoid(p_logits)
        log_p1, log_p0 = nn.functional.logsigmoid(p_logits), nn.functional.logsigmoid(-p_logits)
        log_q1, log_q0 = nn.functional.logsigmoid(q_logits), nn.functional.logsigmoid(-q_logits)
        return (p * (log_p1 - log_q1) + (1 - p) * (log_p0 - log_q0)).sum(-1)


MASKED_LOGIT = -1e8  # a finite "minus infinity": masked actions get probability 0 and entropy terms stay 0, not NaN


def masked_log_probs(log_probs: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """Categorical log-probabilities renormalized over the valid actions (`action_mask` True)."""
    return torch.log_softmax(log_probs.masked_fill(~action_mask, MASKED_LOGIT), dim=-1)


def masked_policy(head: nn.Module, params: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """A categorical head's output restricted to the valid actions. MultiDiscrete actions: the mask is every
    entry's mask side by side ([B, sum(nvec)], sb3-contrib's convention), each entry renormalized on its own."""
    if isinstance(head, MultiCategoricalHead):
        entries = zip(params.split(head.nvec, dim=-1), action_mask.split(head.nvec, dim=-1), strict=True)
        return torch.cat([masked_log_probs(p, m) for p, m in entries], -1)
    return masked_log_probs(params, action_mask)


class GaussianHead(nn.Module):
    """Box actions: a diagonal Gaussian with a state-independent learned log std.

    Samples are stored unclipped (their log-prob stays exact); the collector clips them to the
    action bounds only when sending them to the env.
    """

    def __init__(self, in_features: int, action_dim: int, log_std_init: float = 0.0):
        super().__init__()
        self.mean = nn.Linear(in_features, action_dim)
        self.log_std = nn.Parameter(torch.full((action_dim,), float(log_std_init)))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.mean(features)

    def sample(self, mean: torch.Tensor, deterministic: bool) -> torch.Tensor:
        if deterministic:
            return mean
        return mean + self.log_std.exp() * torch.randn_like(mean)

    def log_prob(self, mean: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        z = (actions - mean) * torch.exp(-self.log_std)
        return (-0.5 * z.square() - self.log_std - 0.5 * _LOG_2PI).sum(-1)

    def entropy(self, mean: torch.Tensor) -> torch.Tensor:
        per_dim = 0.5 + 0.5 * _LOG_2PI + self.log_std
        return per_dim.sum().expand(mean.shape[:-1])

    def kl(self, p_mean: torch.Tensor, q_mean: torch.Tensor, p_head: GaussianHead) -> torch.Tensor:
        """KL(p || q) per state for diagonal Gaussians; p's log std comes from `p_head`, q's is this head's."""
        return diag_gaussian_kl(p_mean, p_head.log_std, q_mean, self.log_std)


def diag_gaussian_kl(p_mean: torch.Tensor, p_log_std: torch.Tensor, q_mean: torch.Tensor,
                     q_log_std: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per state between diagonal Gaussians, summed over action dimensions."""
    var_ratio = torch.exp(2 * (p_log_std - q_log_std))
    mean_term = ((p_mean - q_mean) * torch.exp(-q_log_std)).square()
    return 0.5 * (var_ratio + mean_term - 1 - 2 * (p_log_std - q_log_std)).sum(-1)
