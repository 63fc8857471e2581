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
from typing import Any

import torch

from rlcli.registry import ConfigError, did_you_mean, require


class KLPrior:
    name = "kl_prior"

    def __init__(self, actor: Any, checkpoint: str | None = None, coef: float = 0.1) -> None:
        from rlcli.trainer import load_actor_weights

        if not checkpoint:
            raise ConfigError("algo.policy_loss_addons.kl_prior.checkpoint is not set: give the prior policy's "
                              "checkpoint (a run's checkpoints/latest or a ckpt_*.pt file)")
        require(coef >= 0, "algo.policy_loss_addons.kl_prior.coef", coef, "must be >= 0")
        path = Path(checkpoint)  # a file, checkpoints/latest, or a run directory (see load_actor_weights)
        self.prior = copy.deepcopy(actor)
        load_actor_weights(self.prior, path)
        self.prior.requires_grad_(False)
        self.coef = coef

    def loss(self, actor: Any, obs: torch.Tensor, mask: torch.Tensor, coef: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(coef * mean KL, mean KL) over a minibatch's real (unmasked) states."""
        from rlcli.algos.base import masked_mean

        with torch.no_grad():
            prior_params = self.prior.policy_params(obs)
        kl = masked_mean(actor.head.kl(prior_params, actor.policy_params(obs), self.prior.head), mask)
        return coef * kl, kl.detach()


ADDONS = {"kl_prior": KLPrior}


def build_addons(algo: Any, spec: dict[str, Any] | None) -> list[Any]:
    """Attach the configured add-ons to `algo`; each coefficient becomes the schedulable `<name>_coef`."""
    addons = []
    for name, settings in (spec or {}).items():
        if name not in ADDONS:
            raise ConfigError(f"algo.policy_loss_addons.{name}: unknown add-on{did_you_mean(name, list(ADDONS))}; "
                              f"choose from: {', '.join(ADDONS)}")
        if not getattr(algo, "on_policy", False) or getattr(algo.actor, "recurrent", False):
            raise ConfigError(f"algo.policy_loss_addons.{name} works with the on-policy algorithms and MLP actors")
        settings = dict(settings or {})
        unknown = set(settings) - {"checkpoint", "coef"}
        if unknown:
            raise ConfigError(f"algo.policy_loss_addons.{name}: unknown keys {sorted(unknown)}; "
                              "valid: checkpoint, coef")
        addon = ADDONS[name](algo.actor, **settings)
        setattr(algo, f"{name}_coef", float(addon.coef))
        addons.append(addon)
    algo.policy_addons = addons
    return addons


def addon_losses(algo: Any, obs: torch.Tensor, mask: torch.Tensor) -> tuple[Any, dict[str, torch.Tensor]]:
    """The sum of the add-on terms for these observations (0 without add-ons), and each term for logging."""
    total: Any = 0.0
    logs = {}
    for addon in getattr(algo, "policy_addons", ()):
        term, value = addon.loss(algo.actor, obs, mask, getattr(algo, f"{addon.name}_coef"))
        total = total + term
        logs[addon.name] = value
    return total, logs
