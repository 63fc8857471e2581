"""Name -> factory registries for each config group, with config checking.

Every group config carries `name:` (the registry key); its other keys are the factory's keyword
arguments. `build()` checks them against the factory's signature and type hints before calling it,
so a typo or a wrong type is one readable line, not a stack trace from deep inside torch.
Third-party packages add components through the entry-point group `rlcli.<kind>s`.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import inspect
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

F = TypeVar("F", bound=Callable[..., Any])


class ConfigError(ValueError):
    """A user-facing configuration mistake; its message is one line naming the value and the choices."""


def did_you_mean(word: str, choices: list[str], prefix: str = "") -> str:
    """` (did you mean 'x'?)` for the closest choice, or ""; with `prefix` (a key's section), the whole key:
    `total_step` in train -> ` (did you mean 'train.total_steps'?)`."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.5)
    return f" (did you mean '{prefix + '.' if prefix else ''}{close[0]}'?)" if close else ""


# Names users of Stable-Baselines3 / RL-Zoo type, and rlcli's key for each.
SB3_NAMES = {
    "learning_rate": "algo.lr", "n_timesteps": "train.total_steps", "total_timesteps": "train.total_steps",
    "buffer_size": "buffer.capacity", "n_envs": "train.num_envs", "net_arch": "actor.hidden_sizes",
    "policy_kwargs": "actor.* (net_arch: actor.hidden_sizes, activation_fn: actor.activation)",
    "activation_fn": "actor.activation", "normalize": "env.normalize_obs and env.normalize_reward",
    "tensorboard_log": "hydra.run.dir (TensorBoard events go to <run dir>/tb)", "verbose": "log.console",
    "policy": "actor (actor=mlp|cnn|gru|lstm)", "eval_freq": "train.test_every",
    "n_eval_episodes": "train.test_episodes", "use_sde": "algo.use_sde, with algo=ppo, ppo_kl, a2c, trpo, sac or tqc",
}


def sb3_hint(key: str) -> str:
    """`algo.learning_rate` -> " (SB3's learning_rate is algo.lr here)"; empty for other keys."""
    leaf = key.rsplit(".", 1)[-1]
    return f" (SB3's {leaf} is {SB3_NAMES[leaf]} here)" if leaf in SB3_NAMES else ""


def owners_phrase(kind: str, name: str, owners: Sequence[str]) -> str:
    """" (a setting of algo=qmix, not of algo=vdn)": the other components that take a key `name` lacks."""
    if not owners:
        return ""
    listed = f"{kind}=" + ", ".join(owners[:4]) + (", ..." if len(owners) > 4 else "")
    return f" (a setting of {listed}, not of {kind}={name})"


def as_typed(value: Any) -> str:
    """A setting's value as a user typed it in a message: true and null, not Python's True and None; strings and
    numbers as repr."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else repr(value)


def require(ok: bool, key: str, value: Any, rule: str) -> None:
    """Raise a one-line ConfigError unless `ok`; used by constructors for range checks."""
    if not ok:
        raise ConfigError(f"{key}={as_typed(value)} is invalid: {rule}")


class Registry:
    """Maps names to factories (classes or functions) for one config group."""

    def __init__(self, kind: str, builtin_module: str | None = None) -> None:
        self.kind = kind
        self.builtin_module = builtin_module  # imported on first look-up: its modules register the built-ins
        self._factories: dict[str, Callable[..., Any]] = {}
        self._specs: dict[str, Any] = {}
        self._plugins_loaded = False

    def register(self, name: str, spec: Any = None) -> Callable[[F], F]:
        """Register a factory under `name`, with the spec (contracts.py) that says what it needs and provides."""

        def decorator(factory: F) -> F:
            if name in self._factories and self._factories[name] is not factory:
                raise ValueError(f"{self.kind} '{name}' is registered twice")
            self._factories[name] = factory
            if spec is not None:
                self._specs[name] = spec
            return factory

        return decorator

    def spec(self, name: str) -> Any:
        """The spec registered with `name`; a component registered without one cannot be wired."""
        self.get(name)
        if name not in self._specs:
            raise ConfigError(f"{self.kind} '{name}' was registered without a spec: register it with "
                              f"@{self.kind.upper()}S.register({name!r}, spec=...) (see rlcli/contracts.py)")
        return self._specs[name]

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        if self.builtin_module:
            importlib.import_module(self.builtin_module)
        for ep in entry_points(group=f"rlcli.{self.kind}s"):
            obj = ep.load()  # importing the module runs its @register decorators
            if callable(obj) and ep.name not in self._factories:
                self._factories[ep.name] = obj

    def names(self) -> list[str]:
        self._load_plugins()
        return sorted(self._factories)

    def get(self, name: str) -> Callable[..., Any]:
        if name not in self._factories:
            self._load_plugins()
        if name not in self._factories:
            names = self.names()
            raise ConfigError(
                f"unknown {self.kind} '{name}'{did_you_mean(str(name), names)}; choose from: {', '.join(names)}"
            )
        return self._factories[name]

    def check(self, cfg: Mapping[str, Any], context: tuple[str, ...] = ()) -> None:
        """Check a group config's keys and value types without building anything."""
        name = cfg.get("name")
        if name is None:
            raise ConfigError(f"{self.kind} config has no 'name:' key; choose from: {', '.join(self.names())}")
        kwargs = {k: v for k, v in cfg.items() if k != "name"}
        check_kwargs(self.get(name), kwargs, prefix=self.kind, context=context,
                     owners=lambda key: self.owners_hint(key, name, context))

    def owners_hint(self, key: str, name: str, context: tuple[str, ...]) -> str:
        """" (a setting of algo=qmix)" where `key`, unknown to `name`, is another component's setting."""
        owners = [other for other in self.names() if other != name
                  and key in _accepted_parameters(self._factories[other], context)[0]]
        return owners_phrase(self.kind, name, owners)

    def build(self, cfg: Mapping[str, Any], **context: Any) -> Any:
        """Build the component named by `cfg["name"]` with the other keys plus `context` objects."""
        self.check(cfg, tuple(context))
        kwargs = {k: v for k, v in cfg.items() if k != "name"}
        return self.get(cfg["name"])(**kwargs, **context)


def check_kwargs(
    factory: Callable[..., Any], kwargs: Mapping[str, Any], prefix: str, context: tuple[str, ...] = (),
    owners: Callable[[str], str] | None = None,
) -> None:
    """Unknown keys and values of the wrong type become one-line ConfigErrors naming `prefix.key`; `owners` says
    which other components take an unknown key (Registry.owners_hint)."""
    params, hints = _accepted_parameters(factory, context)
    for key, value in kwargs.items():
        if key not in params:
            valid = sorted(params)
            hint = sb3_hint(key) or (owners(key) if owners else "") or did_you_mean(key, valid, prefix=prefix)
            raise ConfigError(f"unknown key '{prefix}.{key}'{hint}; valid keys: {', '.join(valid) or '(none)'}")
        if key in hints:
            problem = _type_problem(value, hints[key])
            if problem:
                raise ConfigError(f"{prefix}.{key}={as_typed(value)} is invalid: {problem}")
    missing = [n for n, p in params.items() if p.default is p.empty and n not in kwargs]
    if missing:
        raise ConfigError(f"{prefix} is missing required key(s): {', '.join(f'{prefix}.{m}' for m in missing)}")


def defaults_of(factory: Callable[..., Any], context: tuple[str, ...] = ()) -> dict[str, Any]:
    """The settings a factory takes and their defaults, as its signature states them (those with one)."""
    params, _ = _accepted_parameters(factory, context)
    return {name: p.default for name, p in params.items() if p.default is not p.empty}


def _accepted_parameters(
    factory: Callable[..., Any], context: tuple[str, ...]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Keyword parameters and type hints of a factory. A class whose __init__ passes **kwargs on to
    its base class (rnd_ppo -> ppo) accepts the base's parameters too."""
    targets = [factory]
    if inspect.isclass(factory):
        targets = [c.__init__ for c in factory.__mro__ if c is not object and "__init__" in c.__dict__]
    params: dict[str, Any] = {}
    hints: dict[str, Any] = {}
    for target in targets:
        signature = inspect.signature(target)
        for n, p in signature.parameters.items():
            if n not in ("self", *context) and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                params.setdefault(n, p)
        with contextlib.suppress(Exception):  # unresolvable annotations (plugins): skip type checks, keep key checks
            hints = typing.get_type_hints(target) | hints
        if not any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
            break
    return params, hints


def _type_problem(value: Any, hint: Any) -> str | None:
    """Return why `value` does not fit `hint` (None if it fits). Covers the types configs use."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return None
    if origin is Union or origin is types.UnionType:
        problems = [_type_problem(value, a) for a in args]
        if any(p is None for p in problems):
            return None
        return " or ".join(dict.fromkeys(p for p in problems if p))
    if hint is type(None):
        return None if value is None else "expected null"
    if origin is Literal:
        return None if value in args else f"choose from: {', '.join(map(str, args))}"
    if hint is bool:
        return None if isinstance(value, bool) else "expected true or false"
    if hint is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else "expected an integer"
    if hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if ok else "expected a number"
    if hint is str:
        return None if isinstance(value, str) else "expected a string"
    if origin in (list, tuple) or hint in (list, tuple) or str(origin) == "collections.abc.Sequence":
        if not isinstance(value, (list, tuple)):
            return "expected a list"
        if args and args[0] is not Ellipsis:
            for item in value:
                problem = _type_problem(item, args[0])
                if problem:
                    return f"list item {item!r}: {problem}"
        return None
    if origin is dict or hint is dict or str(origin) == "collections.abc.Mapping":
        return None if isinstance(value, Mapping) else "expected a mapping"
    return None


ENVS = Registry("env", "rlcli.envs")
ACTORS = Registry("actor", "rlcli.actors")
ALGOS = Registry("algo", "rlcli.algos")
BUFFERS = Registry("buffer", "rlcli.buffers")
