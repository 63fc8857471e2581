"""Values over a run, one mechanism for all: `algo.schedules.<name>=linear:0.01:0.0`.

Every value that changes with the run's progress (env steps / train.total_steps, 0 -> 1) is a
Schedule applied by the trainer before each collect phase (what acting reads: DQN's `epsilon`,
TD3's `noise_scale`) and again before each update (what learning reads). Components declare the
schedules their own settings imply in `default_schedules` (DQN's exploration_* keys, `lr_schedule`,
`clip_range_schedule`, `noise_decay`, PER's `beta` -> `beta_final`, ERE's `eta` -> `eta_final`);
an `algo.schedules` entry replaces the default of the same value. Names:

    lr                 every optimizer's learning rate (and its base)
    lr_scale           a factor on each parameter group's base learning rate (lr_schedule=linear: 1 -> 0)
    <addon>_coef       a policy-loss add-on's coefficient (kl_prior_coef)
    beta, eta          the storage's PER exponent and ERE recency (buffer=per / ere)
    anything else      a setting the algorithm declares schedulable (`schedulable`: ent_coef, clip_range_scale,
                       epsilon, tau, ...); counts and sizes (n_steps, batch_size, n_quantiles) are not

Forms:

    constant:V            V throughout
    linear:A:B            A at the start, B at the end
    linear:A:B:P          A at the start, B from progress P (0-1) on
    exp:A:B               geometric interpolation from A to B (both > 0)
    step:A:B:P            A until progress P (0-1), then B
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rlcli.registry import ConfigError, did_you_mean

FORMS = "constant:V, linear:A:B[:P], exp:A:B, step:A:B:P"


@dataclass(frozen=True)
class Schedule:
    kind: str
    start: float
    end: float
    at: float = 1.0  # linear: the progress at which `end` is reached; step: where it switches

    def __call__(self, progress: float) -> float:
        p = min(max(progress, 0.0), 1.0)
        if self.kind == "constant":
            return self.start
        if self.kind == "linear":
            if self.at <= 0:
                return self.end
            return self.start + (self.end - self.start) * min(1.0, p / self.at)
        if self.kind == "exp":
            return self.start * math.exp(math.log(self.end / self.start) * p)
        return self.start if p < self.at else self.end  # step


def to_zero(kind: str) -> Schedule | None:
    """A legacy `<x>_schedule: constant | linear` setting as the schedule of a factor: none, or 1 -> 0."""
    return Schedule("linear", 1.0, 0.0) if kind == "linear" else None


@dataclass(frozen=True)
class ScheduledValue:
    """A schedule bound to the value it sets."""

    name: str
    schedule: Schedule
    set: Callable[[float], None]


def parse_schedule(key: str, text: Any) -> Schedule:
    """`linear:0.01:0.0` -> Schedule; anything else is a one-line error naming the key and the forms."""
    parts = str(text).strip().split(":")
    kind, numbers = parts[0], parts[1:]
    expected = {"constant": (1,), "linear": (2, 3), "exp": (2,), "step": (3,)}
    try:
        values = [float(n) for n in numbers]
    except ValueError:
        values = None
    if kind not in expected or values is None or len(values) not in expected[kind]:
        raise ConfigError(f"algo.schedules.{key}={text!r} does not parse; use one of: {FORMS}")
    if kind == "exp" and not (values[0] > 0 and values[1] > 0):
        raise ConfigError(f"algo.schedules.{key}={text!r}: exp needs two positive values")
    if len(values) == 3 and not 0 <= values[2] <= 1:
        raise ConfigError(f"algo.schedules.{key}={text!r}: the third value must be a progress in [0, 1]")
    if kind == "constant":
        return Schedule(kind, values[0], values[0])
    return Schedule(kind, values[0], values[1], values[2] if len(values) == 3 else 1.0)


def numeric_params(algo: Any, addons: Sequence[Any] = (), storage: Any = None) -> list[str]:
    """What can be scheduled: what the algorithm declares (`schedulable`), lr when it has optimizers, the
    add-ons' coefficients and the values the storage schedules itself."""
    names = set(algo.schedulable)
    names |= {f"{addon.name}_coef" for addon in addons}
    names |= set(storage.default_schedules if storage is not None else {})
    return sorted(names | ({"lr", "lr_scale"} if algo.optimizers() else set()))


def _setter(algo: Any, key: str, addons: Sequence[Any], storage: Any) -> Callable[[float], None]:
    addon = next((a for a in addons if f"{a.name}_coef" == key), None)
    if addon is not None:
        return lambda value: setattr(addon, "coef", value)
    if key == "lr":
        def set_lr(value: float) -> None:
            for optimizer in algo.optimizers():
                for group in optimizer.param_groups:
                    group["lr"] = value
                    if "base_lr" in group:
                        group["base_lr"] = value
        return set_lr
    if key == "lr_scale" and key not in algo.schedulable:  # algorithms that do not scale lr themselves (sac, dqn)
        def scale_lr(value: float) -> None:
            for optimizer in algo.optimizers():
                for group in optimizer.param_groups:
                    group.setdefault("base_lr", group["lr"])  # kept in the optimizer's state: resume sees it
                    group["lr"] = group["base_lr"] * value
        return scale_lr
    if storage is not None and key in storage.default_schedules:
        return lambda value: setattr(storage, key, value)
    return lambda value: setattr(algo, key, float(value))


# An explicit schedule of the first replaces a default schedule of the second: they set the same value.
REPLACES = {"lr": "lr_scale"}


def build_schedules(algo: Any, spec: dict[str, Any] | None, addons: Sequence[Any] = (),
                    storage: Any = None) -> list[ScheduledValue]:
    """The defaults that the algorithm and its storage declare, with `algo.schedules` entries on top. A nested entry
    (`algo.schedules.<group>.ent_coef`, algo.groups) names one group's setting as `<group>.ent_coef`; an entry for
    every group replaces the groups' own defaults of that value too (`lr` their `<group>.lr_scale`)."""
    explicit = {key: parse_schedule(key, text) for key, text in _flat(spec or {}).items()}
    valid = numeric_params(algo, addons, storage)
    groups = getattr(algo, "algos", None)  # algo.groups: {group: its algorithm} (algos/grouped.py)
    for key in explicit:
        if key in valid:
            continue
        group, dot, setting = key.rpartition(".")
        if dot and isinstance(groups, dict) and group not in groups:
            hint = did_you_mean(group, list(groups))
            raise ConfigError(f"algo.schedules.{key}: '{group}' is not one of this run's groups{hint}; its groups: "
                              f"{', '.join(groups)} (algo.schedules.{setting} moves it in every group)")
        if dot and not isinstance(groups, dict):
            raise ConfigError(f"algo.schedules.{key}: a schedule per group ('{group}.') is for runs with algo.groups "
                              f"(docs/guide/multiagent.md); this run has one algorithm: algo.schedules.{setting}")
        name = type(algo).__name__ if not isinstance(groups, dict) else "this run's groups"
        raise ConfigError(f"algo.schedules.{key}: {name} has no numeric parameter '{key}'; schedulable: "
                          f"{', '.join(valid)}")
    schedules = {**algo.default_schedules, **(storage.default_schedules if storage is not None else {})}
    for key in explicit:
        replaced = {key, REPLACES.get(key, key)}
        for default in [d for d in schedules if d in replaced or d.rpartition(".")[2] in replaced and "." not in key]:
            schedules.pop(default)
    schedules.update(explicit)
    return [ScheduledValue(key, schedule, _setter(algo, key, addons, storage)) for key, schedule in schedules.items()]


def _flat(spec: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{group: {ent_coef: ...}} -> {"group.ent_coef": ...}; flat entries as they are."""
    flat: dict[str, Any] = {}
    for key, value in spec.items():
        if isinstance(value, dict):
            flat |= _flat(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def apply_schedules(scheduled: Sequence[ScheduledValue], progress: float) -> dict[str, float]:
    """Set every scheduled value for this progress; returns the values (logged as train/schedule_<name>)."""
    values = {}
    for item in scheduled:
        value = item.schedule(progress)
        item.set(value)
        values[item.name] = value
    return values
