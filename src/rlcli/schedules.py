"""Schedules for any numeric algorithm parameter: `algo.schedules.ent_coef=linear:0.01:0.0`.

One mechanism for every algorithm: before each update the trainer sets the scheduled attribute on
the algorithm from the run's progress (env steps / train.total_steps, 0 -> 1). `lr` is special:
it is written into every optimizer's param groups; `<addon>_coef` sets a policy-loss add-on's
coefficient. Forms:

    constant:V            V throughout
    linear:A:B            A at the start, B at the end
    exp:A:B               geometric interpolation from A to B (both > 0)
    step:A:B:P            A until progress P (0-1), then B
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlcli.registry import ConfigError

FORMS = "constant:V, linear:A:B, exp:A:B, step:A:B:P"


@dataclass(frozen=True)
class Schedule:
    kind: str
    start: float
    end: float
    at: float = 1.0

    def __call__(self, progress: float) -> float:
        p = min(max(progress, 0.0), 1.0)
        if self.kind == "constant":
            return self.start
        if self.kind == "linear":
            return self.start + (self.end - self.start) * p
        if self.kind == "exp":
            return self.start * math.exp(math.log(self.end / self.start) * p)
        return self.start if p < self.at else self.end  # step


def parse_schedule(key: str, text: Any) -> Schedule:
    """`linear:0.01:0.0` -> Schedule; anything else is a one-line error naming the key and the forms."""
    parts = str(text).strip().split(":")
    kind, numbers = parts[0], parts[1:]
    expected = {"constant": 1, "linear": 2, "exp": 2, "step": 3}
    try:
        values = [float(n) for n in numbers]
    except ValueError:
        values = None
    if kind not in expected or values is None or len(values) != expected[kind]:
        raise ConfigError(f"algo.schedules.{key}={text!r} does not parse; use one of: {FORMS}")
    if kind == "exp" and not (values[0] > 0 and values[1] > 0):
        raise ConfigError(f"algo.schedules.{key}={text!r}: exp needs two positive values")
    if kind == "step" and not 0 <= values[2] <= 1:
        raise ConfigError(f"algo.schedules.{key}={text!r}: the step point must be a progress in [0, 1]")
    if kind == "constant":
        return Schedule(kind, values[0], values[0])
    return Schedule(kind, values[0], values[1], values[2] if kind == "step" else 1.0)


def _optimizers(algo: Any) -> list[Any]:
    return [v for v in vars(algo).values() if hasattr(v, "param_groups") and hasattr(v, "step")]


def numeric_params(algo: Any, addons: Sequence[Any] = ()) -> list[str]:
    """What can be scheduled: the algorithm's numeric attributes, lr, and the add-ons' coefficients."""
    names = {k for k, v in vars(algo).items()
             if isinstance(v, (int, float)) and not isinstance(v, bool) and not k.startswith("_")}
    names -= {"n_steps", "num_envs", "batch_size", "n_epochs", "gradient_updates", "env_steps", "progress",
              "learning_starts", "train_freq", "gradient_steps", "action_dim", "policy_delay", "target_update_interval",
              "n_actions", "warmup_seen", "obs_norm_warmup_steps", "last_target_update"}
    names |= {f"{addon.name}_coef" for addon in addons}
    return sorted(names | ({"lr"} if _optimizers(algo) else set()))


def build_schedules(algo: Any, spec: dict[str, Any] | None, addons: Sequence[Any] = ()) -> dict[str, Schedule]:
    """Parse and check `algo.schedules` against what the built algorithm (and its add-ons) has."""
    schedules = {key: parse_schedule(key, text) for key, text in (spec or {}).items()}
    valid = numeric_params(algo, addons)
    for key in schedules:
        if key not in valid:
            raise ConfigError(f"algo.schedules.{key}: {type(algo).__name__} has no numeric parameter '{key}'; "
                              f"schedulable: {', '.join(valid)}")
    if "lr" in schedules and getattr(algo, "lr_schedule", "constant") != "constant":
        raise ConfigError("algo.schedules.lr and algo.lr_schedule both schedule the learning rate; use one")
    return schedules


def apply_schedules(algo: Any, schedules: dict[str, Schedule], progress: float,
                    addons: Sequence[Any] = ()) -> dict[str, float]:
    """Set every scheduled parameter for this progress; returns the values (logged under schedule/)."""
    values = {}
    addon_coefs = {f"{addon.name}_coef": addon for addon in addons}
    for key, schedule in schedules.items():
        value = schedule(progress)
        if key in addon_coefs:
            addon_coefs[key].coef = value
        elif key == "lr":
            for optimizer in _optimizers(algo):
                for group in optimizer.param_groups:
                    group["lr"] = value
                    if "base_lr" in group:
                        group["base_lr"] = value
        else:
            setattr(algo, key, type(getattr(algo, key))(value) if isinstance(getattr(algo, key), int) else value)
        values[key] = value
    return values
