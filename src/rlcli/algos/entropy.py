"""The entropy coefficient (SAC's temperature alpha) as one object: fixed, or learned toward a target entropy.

SAC, TQC and CrossQ share it (as Tianshou's `FixedAlpha` / `AutoAlpha`). `ent_coef=auto` learns
log(alpha) with its own Adam so that the policy's entropy approaches `target_entropy` (default: minus
the action dimensions, SB3's choice); a number keeps alpha fixed. The parameter itself lives in the
algorithm's networks (so checkpoints, exports and `.to(device)` carry it); this object owns its
optimizer and the rule.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch import nn

from rlcli.algos.base import adam, masked_mean
from rlcli.algos.loss_step import HasMaxGradNorm, LossStep
from rlcli.registry import require

if TYPE_CHECKING:
    from rlcli.algos.runner import Runner


def check_entropy_settings(ent_coef: float | str, ent_coef_init: float, target_entropy: float | str) -> None:
    """One line naming the bad `algo.ent_coef*` / `algo.target_entropy` value."""
    require(ent_coef == "auto" or (not isinstance(ent_coef, str) and ent_coef >= 0), "algo.ent_coef", ent_coef,
            "use auto (tuned to reach target_entropy) or a fixed number >= 0")
    require(target_entropy == "auto" or not isinstance(target_entropy, str), "algo.target_entropy",
            target_entropy, "use auto (-action dimensions) or a number")
    require(ent_coef_init > 0, "algo.ent_coef_init", ent_coef_init, "must be > 0")


def initial_log_alpha(ent_coef: float | str, ent_coef_init: float) -> float:
    """log(alpha) at the start: of ent_coef_init when learned, of the fixed value (floored above 0) otherwise."""
    init = ent_coef_init if ent_coef == "auto" else max(float(ent_coef), 1e-30)
    return float(np.log(init))


class FixedEntropyCoefficient:
    """`ent_coef` on an algorithm that owns a `temperature`: reads and sets its fixed alpha, so that
    `algo.schedules.ent_coef` moves it (declared schedulable only when alpha is fixed, not learned)."""

    def __get__(self, algo: Any, owner: type | None = None) -> float | None:
        return None if algo is None else algo.temperature.fixed

    def __set__(self, algo: Any, value: float) -> None:
        algo.temperature.fixed = float(value)


class EntropyCoefficient:
    """alpha: `value()` for the losses, `step(log_probs)` after the policy's forward pass (a no-op when fixed)."""

    def __init__(self, log_alpha: nn.Parameter, ent_coef: float | str, target_entropy: float | str,
                 action_dim: int, lr: float, **adam_options: Any) -> None:
        self.log_alpha = log_alpha
        self.learned = ent_coef == "auto"
        self.fixed = None if self.learned else float(ent_coef)
        self.target_entropy = -float(action_dim) if target_entropy == "auto" else float(target_entropy)
        self.optimizer = adam([log_alpha], lr=lr, **adam_options)
        # a fixed alpha can follow a schedule (FixedEntropyCoefficient); a learned one follows its target
        self.schedulable: tuple[str, ...] = () if self.learned else ("ent_coef",)

    def target(self) -> float:
        return self.target_entropy

    def train_step(self, networks: nn.Module, clip_of: HasMaxGradNorm | None) -> LossStep:
        """log(alpha)'s step on `temperature_loss` (its log_alpha is `networks.log_alpha`), as the algorithm's other
        steps: eager or compiled, and over a population's members."""
        return LossStep(networks, self.optimizer, partial(temperature_loss, networks), clip_of)

    def value(self) -> torch.Tensor:
        if self.fixed is not None:
            return torch.tensor(self.fixed, device=self.log_alpha.device)
        return self.log_alpha.detach().exp()


def temperature_loss(networks: nn.Module, log_probs: torch.Tensor, target: float | torch.Tensor,
                     valid: torch.Tensor | None = None) -> tuple[torch.Tensor, tuple[()]]:
    """-mean(log_alpha * (log pi + target entropy)), log_alpha read through the networks (which a population swaps
    each member's weights into); `valid`: the mean over a stored sequence's real steps only."""
    log_alpha = cast(torch.Tensor, networks.log_alpha)  # (a member's row under a population's functional_call)
    terms = log_alpha * (log_probs.detach() + target)
    return -(terms.mean() if valid is None else masked_mean(terms, valid)), ()


def learned_temperature_step(run: Runner, algo: Any, log_probs: torch.Tensor,
                             valid: torch.Tensor | None = None) -> None:
    """The temperature's step where it is learned, through the algorithm's runner (algos/runner.py): in a population,
    each member whose temperature learns, toward its own target entropy. `algo.temperature_train_step` is
    `algo.temperature.train_step(...)`."""
    if (learning := run.only(lambda member: member.temperature.learned)) is not None:
        masked = () if valid is None else (valid,)
        learning(algo.temperature_train_step, log_probs, run.read(algo.temperature.target), *masked)
