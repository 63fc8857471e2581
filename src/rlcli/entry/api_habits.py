"""What a Stable-Baselines3 user passes to rlcli's Python API, turned into what rlcli takes: an env instance or a
VectorEnv as an id or a function, `policy_kwargs` as actor keys, an algorithm's settings given as top-level keywords,
`more_steps` as train.total_steps, and a raw env observation (a Dict, an int) batched for the env's wrappers. api.py
calls these; they raise api.py's one-line errors."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rlcli.entry.api_errors import InvalidType, InvalidValue, NotFound, RlcliError

_SB3_NAMES = {"learning_rate": "lr"}  # SB3's keyword -> rlcli's algo key, where the names differ


def algo_keywords(settings: Mapping[str, Any], overrides: list[str]) -> dict[str, Any]:
    """SB3's habit, `PPO(env, n_steps=64, learning_rate=1e-3)`: a keyword that is no top-level setting but a key of
    the chosen algorithm's config goes under `algo.`; SB3's names of other settings (`total_timesteps`, `n_envs`,
    `buffer_size`) go to rlcli's keys; anything else is one line naming the closest key."""
    import re

    import yaml

    from rlcli.registry import SB3_NAMES, did_you_mean, sb3_hint
    from rlcli.run.compose import conf_dir

    config = yaml.safe_load((Path(conf_dir()) / "config.yaml").read_text()) or {}
    top = {*config, "env", "algo", "actor", "buffer", "collector", "tuned", "hparams_search"} - {"defaults"}
    loose = [k for k in settings if k not in top]
    if not loose:
        return dict(settings)
    choice = settings.get("algo")
    if isinstance(choice, Mapping):
        choice = choice.get("name")
    if choice is None:
        chosen = [a.split("=", 1)[1] for a in overrides if a.split("=", 1)[0] == "algo"]
        defaults = [d["algo"] for d in config.get("defaults", []) if isinstance(d, dict) and "algo" in d]
        choice = (chosen or defaults or [None])[-1]
    file = Path(conf_dir()) / "algo" / f"{choice}.yaml"
    if not isinstance(choice, str) or not file.is_file():
        return dict(settings)
    from rlcli.run.algo_defaults import algo_defaults

    algo_config = yaml.safe_load(file.read_text()) or {}
    stated = algo_config.get("algo", algo_config) if "name" not in algo_config else algo_config
    # the yaml states only what differs from its algorithm's constructor (run/algo_defaults.py): both are its keys
    keys = (set(stated) | set(algo_defaults().get(str(stated.get("name", choice)), {}))) - {"name"}
    out = {k: v for k, v in settings.items() if k in top}
    algo = dict(settings["algo"]) if isinstance(settings.get("algo"), Mapping) else (
        {"name": settings["algo"]} if isinstance(settings.get("algo"), str) else {})
    for key in loose:
        rlcli_key = _SB3_NAMES.get(key, key) if _SB3_NAMES.get(key) in keys else key
        target = SB3_NAMES.get(key, "")
        if rlcli_key in keys:
            algo[rlcli_key] = settings[key]
        elif re.fullmatch(r"\w+\.\w+", target) and key not in ("verbose", "activation_fn"):  # total_timesteps
            section, name = target.split(".")
            given = out.get(section)
            merged = {"name": given} if isinstance(given, str) else dict(given or {})
            merged.setdefault(name, settings[key])  # the section's own key, when given too, wins
            out[section] = merged
        else:
            raise InvalidValue(f"{key}={settings[key]!r} is neither a setting nor a key of algo={choice}'s config"
                               f"{did_you_mean(key, sorted(top | keys))}{sb3_hint(key)}")
    if algo:
        out["algo"] = algo
    return out


_SB3_ACTIVATIONS = {"Tanh": "tanh", "ReLU": "relu", "ELU": "elu", "GELU": "gelu", "SiLU": "silu",
                    "LeakyReLU": "leaky_relu"}


_SB3_ACTOR_KEYS = {"ortho_init": "ortho_init", "log_std_init": "log_std_init", "full_std": "full_std",
                   "use_expln": "use_expln", "share_features_extractor": "shared"}


def actor_keys(policy_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """SB3's `policy_kwargs` as rlcli's actor config keys (conf/actor/mlp.yaml): rlcli builds its networks from
    config, so a network from Python is these keys, and the run directory records them like any other setting."""
    if not isinstance(policy_kwargs, Mapping):
        raise InvalidType(f"policy_kwargs={policy_kwargs!r} must be a dict, e.g. dict(net_arch=[64, 64])")
    out: dict[str, Any] = {}
    for key, value in policy_kwargs.items():
        if key == "net_arch":
            sizes = value
            if isinstance(value, Mapping):
                lists = [list(v) for v in value.values()]
                if not lists or any(v != lists[0] for v in lists):
                    raise InvalidValue(f"policy_kwargs net_arch={dict(value)!r}: rlcli's actors give each network "
                                       "the same hidden sizes (actor.hidden_sizes); give one list, e.g. [64, 64]")
                sizes = lists[0]
            if not isinstance(sizes, list | tuple) or not all(isinstance(n, int) and n > 0 for n in sizes):
                raise InvalidValue(f"policy_kwargs net_arch={value!r} must be a list of layer widths, e.g. [64, 64]")
            out["hidden_sizes"] = list(sizes)
        elif key == "activation_fn":
            name = str(getattr(value, "__name__", value))
            if name not in _SB3_ACTIVATIONS and name not in _SB3_ACTIVATIONS.values():
                raise InvalidValue(f"policy_kwargs activation_fn={value!r} is not one rlcli has; use one of: "
                                   f"{', '.join(f'nn.{n}' for n in _SB3_ACTIVATIONS)}")
            out["activation"] = _SB3_ACTIVATIONS.get(name, name)
        elif key in _SB3_ACTOR_KEYS:
            out[_SB3_ACTOR_KEYS[key]] = value
        else:
            raise InvalidValue(f"policy_kwargs key {key!r} has no rlcli counterpart; accepted: net_arch, "
                               f"activation_fn, {', '.join(_SB3_ACTOR_KEYS)} (other networks: actor= and its keys)")
    return out


def more_steps_overrides(more: Any, resume: str | Path | None, run_dir: str | Path | None,
                         args: list[str]) -> list[str]:
    """`more_steps=n` with `resume`: train.total_steps = the resumed checkpoint's env steps + n."""
    from rlcli.entry.run_loading import is_run_dir
    from rlcli.services import checkpoint

    if not isinstance(more, int) or isinstance(more, bool):
        raise InvalidType(f"more_steps={more!r} must be an int (env steps beyond the checkpoint's)")
    if more < 1:
        raise InvalidValue(f"more_steps={more} is invalid: must be >= 1")
    if resume is None:
        raise InvalidValue(f"more_steps={more} continues a run: give resume=<run dir> too (a new run's budget is "
                           "train={'total_steps': n})")
    if any(a.split("=", 1)[0] == "train.total_steps" for a in args):
        raise InvalidValue(f"more_steps={more} and train.total_steps both set the budget: give one of them")
    target = Path(run_dir if str(resume) == "auto" and run_dir is not None else resume).expanduser()
    if target.is_file():
        found: Path | None = target
    elif target.is_dir() and is_run_dir(target):
        found = checkpoint.find_good(target / "checkpoints", warn=lambda message: None)
    elif str(resume) == "auto":
        found = None  # nothing to resume yet: a fresh run of more_steps
    else:
        raise NotFound(f"resume={str(resume)!r}: no such run directory or checkpoint file")
    steps = 0
    if found is not None:
        try:
            steps = checkpoint.checkpoint_steps(found) or int(checkpoint.load(found)["env_steps"])
        except checkpoint.CheckpointError as error:
            raise RlcliError(str(error)) from None
    return [f"train.total_steps={steps + more}"]


_VECTOR_KWARGS = ("num_envs", "vectorization_mode", "vector_kwargs", "wrappers")  # gymnasium.make_vec's own


def registered_id(spec: Any, vector: bool = False) -> str | None:
    """The gymnasium id an env was made from, when making that id again gives the same env (no other kwargs, no
    extra wrappers): rlcli then trains on the id itself, with its shipped config, and the run resumes anywhere."""
    import gymnasium

    if spec is None or not isinstance(getattr(spec, "id", None), str) or spec.id not in gymnasium.registry:
        return None
    registered = gymnasium.spec(spec.id)
    kwargs = {k: v for k, v in dict(spec.kwargs).items() if not (vector and k in _VECTOR_KWARGS)}
    if vector and (spec.kwargs.get("vector_kwargs") or spec.kwargs.get("wrappers")):
        return None
    same = (kwargs == dict(registered.kwargs) and not spec.additional_wrappers
            and spec.max_episode_steps == registered.max_episode_steps)
    return str(spec.id) if same else None


def env_source(env: Any) -> str | Callable[..., Any]:
    """An env instance or a VectorEnv as what rlcli makes envs from. rlcli makes train.num_envs training envs and
    its own test envs, seeded and wrapped as a run needs (and again on resume), so it cannot step the one object
    given: it remakes it from its registered id, from the function a Sync/AsyncVectorEnv made its envs with, or
    as copies of the instance."""
    import gymnasium
    from gymnasium.vector import VectorEnv

    if isinstance(env, str) or (callable(env) and not isinstance(env, gymnasium.Env | VectorEnv)):
        return env
    if isinstance(env, VectorEnv):
        env_id = registered_id(getattr(env, "spec", None), vector=True)
        functions = getattr(env, "env_fns", None)
        if env_id is None and functions:
            make_one = functions[0]

            def one_of_them(**kwargs: Any) -> Any:  # the function the VectorEnv made its first env with
                return make_one()

            one_of_them.__name__ = f"{type(env).__name__}_instance"
            return one_of_them
        if env_id is None:
            raise InvalidType(f"env={type(env).__name__}(...) is a VectorEnv that rlcli cannot remake (no env_fns, "
                              "no registered id with its defaults): pass a function that makes one of its envs, "
                              "e.g. env=lambda: gymnasium.make(...)")
        return env_id
    if isinstance(env, gymnasium.Env):
        env_id = registered_id(env.spec)
        if env_id is not None:
            return env_id
        import copy

        kind = type(env.unwrapped).__name__
        try:
            copy.deepcopy(env)
        except Exception as error:
            raise InvalidType(f"env={kind}(...) is an env instance that cannot be copied ({type(error).__name__}), "
                              f"and rlcli makes several envs from it: pass a function that makes one, e.g. "
                              f"env=lambda: {kind}(...)") from None

        def copies(**kwargs: Any) -> Any:  # kwargs (a render_mode) cannot be applied to a made instance
            return copy.deepcopy(env)

        copies.__name__ = f"{kind}_instance"
        return copies
    return env  # type: ignore[no-any-return]


def vector_num_envs(env: Any) -> int | None:
    """A VectorEnv's number of envs: train.num_envs for the run, as SB3 trains with the VecEnv's n_envs."""
    if env is None or isinstance(env, str):
        return None
    from gymnasium.vector import VectorEnv

    return int(env.num_envs) if isinstance(env, VectorEnv) else None


def function_name(env: Any) -> str:
    """What to pass as env= again, in a message."""
    name = getattr(env, "__name__", None)
    return name if isinstance(name, str) and name != "<lambda>" else "<the function that made the env>"


def as_space_value(item: Any, space: Any) -> Any:
    """One raw observation in the types `space.contains` checks (numpy ints and arrays of the space's dtype)."""
    import gymnasium
    import numpy as np

    if isinstance(space, gymnasium.spaces.Dict):
        return {k: as_space_value(item[k], s) for k, s in space.spaces.items()}
    if isinstance(space, gymnasium.spaces.Tuple):
        return tuple(as_space_value(e, s) for e, s in zip(item, space.spaces, strict=True))
    if isinstance(space, gymnasium.spaces.Discrete):
        return np.int64(item) if np.ndim(item) == 0 and np.asarray(item).dtype.kind in "iu" else item
    array = np.asarray(item)
    return array.astype(space.dtype) if array.dtype.kind in "biuf" and np.can_cast(array, space.dtype, "same_kind") \
        else array


def batch_of_one(item: Any) -> Any:
    """One raw observation with a leading batch dimension of 1, as a vector env returns it."""
    import numpy as np

    if isinstance(item, Mapping):
        return {k: batch_of_one(v) for k, v in item.items()}
    if isinstance(item, tuple):
        return tuple(np.asarray([e]) for e in item)
    return np.asarray(item)[None]


def short(item: Any) -> str:
    text = repr(item.tolist() if hasattr(item, "tolist") else item)
    return text if len(text) <= 60 else text[:57] + "..."
