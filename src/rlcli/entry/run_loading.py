"""A run directory's checkpoint rebuilt as the agent training had: which checkpoint `load=` names, and the agent
with its env factory from the checkpoint's own config (rl-eval, export and the Python API read runs this way)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def is_run_dir(path: Path) -> bool:
    return (path / ".hydra" / "overrides.yaml").is_file() or (path / "checkpoints").is_dir()


def env_of(run_dir: Path) -> str:
    """The env id a run trained on, from its saved config (`?` when it cannot be read)."""
    from rlcli.run.resume import saved_setting

    found = saved_setting(run_dir, "env", "id")
    return "?" if found is None else str(found)


def check_one_env(target: Path, runs: list[Path]) -> None:
    """Runs are ranked against each other only when they share an env; otherwise say what was found."""
    from rlcli.registry import ConfigError

    by_env: dict[str, list[Path]] = {}
    for run in runs:
        by_env.setdefault(env_of(run), []).append(run)
    if len(by_env) > 1:
        found = ", ".join(f"{env}: {len(found)} run{'s' if len(found) > 1 else ''} (e.g. {found[0]})"
                          for env, found in sorted(by_env.items()))
        raise ConfigError(f"{target} holds runs on {len(by_env)} envs ({found}); rl-eval ranks the runs of one env "
                          "together: give a sweep's directory or one run's")


def checkpoint_of(run_dir: Path, load: str, warn: Callable[[str], None] | None = None) -> Path:
    """The checkpoint file that `load` names in a run directory. `load=last` is the newest checkpoint that verifies:
    when newer ones are torn or corrupted, `warn` gets one line naming them and the older file used instead, since
    a user asking for the last one would otherwise score an older policy without knowing it."""
    from rlcli.registry import ConfigError
    from rlcli.services import checkpoint

    directory = run_dir / "checkpoints"
    if load == "best":
        path = directory / "best.pt"
        if not path.is_file():
            from rlcli.run.resume import saved_setting

            every = saved_setting(run_dir, "train", "test_every")
            why = ("train.test_every=0" if every == 0 else "it stopped before its first one" if
                   isinstance(every, int) else "train.test_every=0, or it stopped before its first one")
            raise ConfigError(f"{run_dir} has no best model (checkpoints/best.pt): no test phase ran ({why}); "
                              "use load=last")
        return path
    if load == "last":
        skipped: list[str] = []
        found = checkpoint.find_good(directory, warn=skipped.append) if directory.is_dir() else None
        if found is None:
            raise ConfigError(f"{run_dir} has no usable checkpoint in checkpoints/")
        if skipped and warn is not None:
            reason = skipped[0].removesuffix("; trying an older checkpoint")
            more = f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""
            warn(f"load=last: {reason}{more}; using the newest good one, {found.name} "
                 f"({checkpoint.checkpoint_steps(found):,} env steps)")
        return found
    if not load.isdigit():
        raise ConfigError(f"load={load!r} is invalid: use best, last or a number of env steps")
    path = directory / f"ckpt_{int(load):012d}.pt"
    if not path.is_file():
        have = sorted(int(p.stem.split("_")[1]) for p in directory.glob("ckpt_*.pt"))
        raise ConfigError(f"load={load}: no checkpoint at {int(load):,} env steps in {directory}; "
                          f"there are: {', '.join(f'{s}' for s in have) or 'none'}")
    return path


# env=pz ids name a module to import (`mpe2.simple_spread_v3`, `module:function`): these packages' are trusted, as
# rlcli's own are for every env (rlcli itself, and the packages of its multiagent extra)
TRUSTED_PACKAGES = ("rlcli", "pettingzoo", "mpe2")


def refuse_named_module(path: Path, env_id: Any, caller: str, multiagent: bool = False) -> None:
    """Refuse an entry-point env id (`module:Env-v0`; with `multiagent`, env=pz's `module` too) that a checkpoint's
    config names, unless its module is already imported or is rlcli's own (or PettingZoo's, mpe2's): building it
    would import (run) that module, and reading a file must not run code the file names. The user builds it by
    naming the id again, or says the file is trusted."""
    from rlcli.registry import ConfigError

    if not isinstance(env_id, str) or not (multiagent or ":" in env_id):
        return
    module = env_id.split(":", 1)[0]
    if module in sys.modules or module.split(".")[0] in (TRUSTED_PACKAGES if multiagent else TRUSTED_PACKAGES[:1]):
        return  # nothing foreign is imported: the module is already loaded, or part of rlcli and its extras
    if caller == "python":
        again, trust = f"env={env_id!r}", "trusted_checkpoint=True"
    else:
        again, trust = f"env.id={env_id}", "trusted_checkpoint=true"
    raise ConfigError(f"{path} names env.id={env_id!r}, whose env is made by importing the module {module!r}; a "
                      f"checkpoint's config is not trusted to import a module: pass {again} to build that env, or "
                      f"{trust} if you trust whoever wrote the file")


def refuse_python_env(path: Path, env_id: Any) -> None:
    """A run trained on `rlcli.train(env=<function>)` in another process: one line naming this file and run and the
    `env=` that rebuilds its env, not gymnasium's "not a registered id"."""

    from rlcli.envs import python_env_missing, python_env_unknown
    from rlcli.registry import ConfigError

    if python_env_unknown(env_id):
        run_dir = path.parent.parent if path.parent.name == "checkpoints" else None
        named = repr(str(run_dir if run_dir is not None else path))
        raise ConfigError(python_env_missing(env_id, named, repr(str(run_dir)) if run_dir else "<run dir>"))


@dataclass
class Loaded:
    """A checkpoint's agent, rebuilt as training built it, with the env factory of its (overridden) config."""

    path: Path
    cfg: Any
    env_factory: Any
    agent: Any
    device: Any
    env_steps: int = 0  # the checkpoint's: a saved policy file keeps it


def _first_interpolation(value: Any) -> str | None:
    if isinstance(value, dict):
        return next((f for f in map(_first_interpolation, [*value.keys(), *value.values()]) if f), None)
    if isinstance(value, list):
        return next((f for f in map(_first_interpolation, value) if f), None)
    return value if isinstance(value, str) and "${" in value else None


def refuse_interpolations(config: Any, path: Path) -> None:
    """A checkpoint's config is saved resolved, so it holds no `${...}`; one that does was written by hand, and
    resolving it could read this machine (`${oc.env:...}`): refused in one line."""
    from rlcli.registry import ConfigError

    found = _first_interpolation(config)
    if found is not None:
        raise ConfigError(f"{path} holds an interpolation in its config ({found[:80]!r}), which rlcli never saves "
                          "(a checkpoint's config is saved resolved): the file was edited, so it was not read")


# a multi-agent env's settings that decide the networks' inputs and outputs (envs/multiagent.py): fixed by training
LAYOUT_KEYS = ("env.joint", "env.agent_id", "env.critic_state", "env.groups", "env.agents", "env.share_params")


def load_agent(path: Path, options: dict[str, Any], env_overrides: list[str]) -> Loaded:
    from omegaconf import OmegaConf

    from rlcli.actors.weights import network_weights
    from rlcli.algos.agent import build_agent, section
    from rlcli.registry import ALGOS, ENVS, ConfigError, as_typed
    from rlcli.services import checkpoint
    from rlcli.services.runtime import configure_torch, resolve_device, seed_everything

    data = checkpoint.load(path, trusted=options.get("trusted_checkpoint", False))
    checkpoint.require(data, path, "config", "algo")
    refuse_interpolations(data["config"], path)
    cfg = OmegaConf.create(data["config"])
    for override in env_overrides:
        key, value = override.split("=", 1)
        if OmegaConf.select(cfg, key, default="<missing>") == "<missing>" and not key.startswith("env.kwargs."):
            valid = sorted(str(k) for k in cfg.env)
            raise ConfigError(f"unknown key '{key}'; valid env keys: {', '.join(valid)}")
        trained, given = OmegaConf.select(cfg, key), OmegaConf.select(OmegaConf.from_dotlist([override]), key)
        if key in LAYOUT_KEYS and trained != given:
            raise ConfigError(f"{override}: the policy was trained with {key}={as_typed(trained)}, which "
                              "shapes what its networks read and give; it cannot change after training (give the "
                              "run's own value, or leave it out)")
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([override]))  # values parse as YAML, as in rl-train
    device = resolve_device(options["device"])
    if options.get("configure_torch", True):  # rl-eval's process is its own; rlcli.load() leaves torch's settings
        configure_torch(int(cfg.get("torch_threads", 1)), deterministic=False)
    if options.get("seed") is not None:
        seed_everything(options["seed"])
    env_config = section(cfg, "env")
    if not any(o.split("=", 1)[0] == "env.id" for o in env_overrides) and not options.get("trusted_checkpoint"):
        refuse_named_module(path, env_config.get("id"), options.get("caller", "rl-eval"),
                            multiagent=env_config.get("name") == "pz")
    refuse_python_env(path, env_config.get("id"))
    env_factory = ENVS.build(env_config)
    if cfg.get("dataset") and OmegaConf.select(cfg, "offline.normalize_obs", default=False) is True:
        env_factory.normalize_obs = True  # the dataset's statistics, saved in the networks' normalizer (run/build.py)
    masks = ALGOS.spec(str(cfg.algo.name)).action_masks
    probe = env_factory.make(1, "sync", eval=True, masks=masks)  # the spaces, as training's envs had them
    try:
        # the algorithm as training built it (its settings are checked against training's number of envs)
        agent = build_agent(cfg, env_factory, probe.single_observation_space, probe.single_action_space, device,
                            int(cfg.train.num_envs), with_addons=False)
    finally:
        probe.close()
    try:
        agent.algo.networks.load_state_dict(network_weights(data))
    except RuntimeError:
        from rlcli.actors.weights import weights_mismatch

        raise ConfigError(f"{path.name} does not fit env {env_factory.spec.id}: "
                          f"{weights_mismatch(network_weights(data), agent.algo.networks.state_dict())}") from None
    from rlcli.run.finite import nonfinite_weights

    bad = nonfinite_weights([*agent.algo.networks.named_parameters(), *agent.algo.networks.named_buffers()])
    if bad:
        raise ConfigError(f"{path} holds non-finite network weights ({', '.join(bad[:3])}): the run diverged "
                          "before it was saved; evaluate or export an earlier checkpoint (load=<env steps>)")
    agent.algo.networks.eval()
    return Loaded(path, cfg, env_factory, agent, device, int(data.get("env_steps", 0)))
