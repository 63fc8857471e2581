"""Policy-loss add-ons: extra terms in an on-policy algorithm's policy loss (`algo.policy_loss_addons`).

    algo.policy_loss_addons.kl_prior.checkpoint=runs/ppo/CartPole-v1/<run>/checkpoints/latest
    algo.policy_loss_addons.kl_prior.coef=0.5
    algo.schedules.kl_prior_coef=linear:0.5:0.0          # coefficients are algorithm parameters

`kl_prior` adds coef * KL(prior || current) over the minibatch's states, attracting the policy
toward a fixed prior policy loaded from a checkpoint (its observation statistics are not used:
both policies see the observations as the current run normalizes them).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Protocol

import torch

from rlcli.actors.weights import load_network_weights
from rlcli.registry import ConfigError, did_you_mean, require


class PolicyAddon(Protocol):
    """An extra policy-loss term; `coef` is schedulable as `algo.schedules.<name>_coef`."""

    name: str
    coef: float

    def loss(self, networks: Any, obs: torch.Tensor, mask: torch.Tensor,
             coef: float | torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]: ...


class KLPrior:
    name = "kl_prior"

    def __init__(self, networks: Any, checkpoint: str | None = None, coef: float = 0.1,
                 trusted_checkpoint: bool = False) -> None:
        if not checkpoint:
            raise ConfigError("algo.policy_loss_addons.kl_prior.checkpoint is not set: give the prior policy's "
                              "checkpoint (a run's checkpoints/latest or a ckpt_*.pt file)")
        require(coef >= 0, "algo.policy_loss_addons.kl_prior.coef", coef, "must be >= 0")
        path = Path(checkpoint)  # a file, checkpoints/latest, or a run directory (see load_network_weights)
        self.prior = copy.deepcopy(networks)
        load_network_weights(self.prior, path, "algo.policy_loss_addons.kl_prior.checkpoint", trusted_checkpoint)
        self.prior.requires_grad_(False)
        self.coef = coef

    def loss(self, networks: Any, obs: torch.Tensor, mask: torch.Tensor,
             coef: float | torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(coef * mean KL, mean KL) over a minibatch's real (unmasked) states; `coef`: the coefficient given (a
        compiled step's is a tensor, so that a scheduled value is not a new graph), else `self.coef`."""
        with torch.no_grad():
            prior_params = self.prior.policy_params(obs)
        kl = networks.head.kl(prior_params, networks.policy_params(obs), self.prior.head)
        kl = (kl * mask).sum() / mask.sum().clamp_min(1.0)
        return (self.coef if coef is None else coef) * kl, kl.detach()


ADDONS = {"kl_prior": KLPrior}


def build_addons(networks: Any, spec: dict[str, Any] | None, supported: bool,
                 trusted_checkpoint: bool = False) -> list[PolicyAddon]:
    """The configured add-ons for an algorithm's `policy_addons` (`supported`: an on-policy algorithm with a
    feed-forward network, the only kind whose policy loss they join)."""
    addons: list[PolicyAddon] = []
    for name, settings in (spec or {}).items():
        if name not in ADDONS:
            raise ConfigError(f"algo.policy_loss_addons.{name}: unknown add-on{did_you_mean(name, list(ADDONS))}; "
                              f"choose from: {', '.join(ADDONS)}")
        if not supported:
            raise ConfigError(f"algo.policy_loss_addons.{name} works with the on-policy algorithms and MLP actors")
        settings = dict(settings or {})
        unknown = set(settings) - {"checkpoint", "coef"}
        if unknown:
            raise ConfigError(f"algo.policy_loss_addons.{name}: unknown keys {sorted(unknown)}; "
                              "valid: checkpoint, coef")
        addons.append(ADDONS[name](networks, **settings, trusted_checkpoint=trusted_checkpoint))
    return addons


def addon_coefs(addons: list[PolicyAddon]) -> tuple[float, ...] | None:
    """The add-ons' coefficients, a loss's argument (None without add-ons): a compiled step takes each as a
    tensor (algos/loss_step.py), so that a scheduled value is not a new graph."""
    return tuple(addon.coef for addon in addons) if addons else None


def addon_losses(addons: list[PolicyAddon], networks: Any, obs: torch.Tensor, mask: torch.Tensor,
                 coefs: Any = None) -> tuple[Any, dict[str, torch.Tensor]]:
    """The sum of the add-on terms for these observations (0 without add-ons), and each term for logging;
    `coefs`: `addon_coefs`' values (floats, or a compiled step's tensors), else each add-on's own coefficient."""
    total: Any = 0.0
    logs = {}
    for i, addon in enumerate(addons):
        term, value = addon.loss(networks, obs, mask, None if coefs is None else coefs[i])
        total = total + term
        logs[addon.name] = value
    return total, logs
