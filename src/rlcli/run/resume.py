"""`rl-train resume=...`: find the run and checkpoint, rebuild its command line, check overrides.

Hydra rewrites `.hydra/` before the task runs, so resuming cannot simply point Hydra at an old
directory. Instead `resume_args` turns `resume=<run dir | checkpoint | auto>` into the run's own
saved overrides plus the new ones, with `hydra.run.dir` set to the run and `resume` set to the
checkpoint file. The checkpoint's stored config is the source of truth: `incompatible_changes`
lists what the new config changes that cannot change mid-run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import ListConfig, OmegaConf

from rlcli.registry import ConfigError
from rlcli.services.log import say

# Keys that may differ between a checkpoint's config and the resumed run's.
CHANGEABLE = (
    "train.total_steps", "train.test_every", "train.test_episodes", "train.log_every", "train.tb_every",
    "train.stop_reward",
    "train.checkpoint_every", "train.keep_checkpoints", "train.on_nonfinite", "train.max_nonfinite", "log.",
    "device", "torch_threads", "compile", "resume",
    "trusted_checkpoint",
    "actor.init_from", "sweep.", "collector.address", "collector.max_restarts", "collector.cpus_per_worker",
)


def _key(arg: str) -> str:
    return arg.split("=", 1)[0].lstrip("+~")


def _value(arg: str) -> str:
    return arg.split("=", 1)[1].strip().strip("'\"")


def _quote(path: Path) -> str:
    text = str(path).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"


def _warn(message: str) -> None:
    say(f"rl-train: warning: {message}")


def resume_args(args: list[str]) -> list[str]:
    """Rewrite a command line holding `resume=...` into the resumed run's full command line."""
    resume = [a for a in args if _key(a) == "resume"]
    if not resume:
        return args
    from rlcli.services import checkpoint  # imports torch: only when resuming, so `rl-train --help` stays fast

    value = _value(resume[-1])
    rest = [a for a in args if _key(a) != "resume"]
    if value.lower() in ("", "null", "none"):
        return rest
    run_dirs = [_value(a) for a in rest if _key(a) == "hydra.run.dir"]
    if value == "auto":
        if not run_dirs:
            raise ConfigError("resume=auto needs hydra.run.dir=<run dir> so that a re-queued job finds its own run")
        run_dir = Path(run_dirs[-1]).resolve()
        ckpt = checkpoint.find_good(run_dir / "checkpoints", warn=_warn) if run_dir.is_dir() else None
        if ckpt is None:
            return rest  # nothing to resume yet: start fresh in that directory
    else:
        target = Path(value).expanduser().resolve()
        if target.is_file():
            checkpoint.verify(target)  # an explicitly named checkpoint must be good; no silent fallback
            ckpt, run_dir = target, target.parent.parent
        elif target.is_dir():
            run_dir = target
            ckpt = checkpoint.find_good(run_dir / "checkpoints", warn=_warn)
            never_trained = not any((run_dir / "checkpoints").glob("ckpt_*.pt"))  # stopped during start-up
            if ckpt is None and never_trained and (run_dir / ".hydra" / "overrides.yaml").is_file():
                _warn(f"{run_dir} has no checkpoint yet (it stopped before training): starting it fresh")
                return [*_saved_overrides(run_dir), *_new_overrides(rest), f"hydra.run.dir={_quote(run_dir)}"]
            if ckpt is None:
                raise ConfigError(f"resume={value!r}: no usable checkpoint in {run_dir / 'checkpoints'}")
        else:
            raise ConfigError(f"resume={value!r}: no such run directory or checkpoint file")
    saved_path = run_dir / ".hydra" / "overrides.yaml"
    if not saved_path.is_file():
        raise ConfigError(f"resume={value!r}: {run_dir} is not an rl-train run directory (no .hydra/overrides.yaml)")
    return [*_saved_overrides(run_dir), *_new_overrides(rest), f"hydra.run.dir={_quote(run_dir)}",
            f"resume={_quote(ckpt)}"]


# Saved overrides that are permissions of one invocation, never replayed from a run directory.
NOT_REPLAYED = ("resume", "hydra.run.dir", "trusted_checkpoint")


def owned_roots() -> set[str]:
    """The first parts of the keys rlcli owns: the primary config's keys and its groups (conf/), not Hydra's."""
    from rlcli.run.compose import conf_dir

    root = Path(conf_dir())
    primary = OmegaConf.load(root / "config.yaml")
    keys = {str(k) for k in primary if k not in ("defaults", "hydra")}  # type: ignore[union-attr]
    groups = {p.name for p in root.iterdir() if p.is_dir() and p.name not in ("hydra",)}
    return keys | groups


def _root(key: str) -> str:
    return key.split(".", 1)[0].split("/", 1)[0].split("@", 1)[0]


def _saved_overrides(run_dir: Path) -> list[str]:
    """The run's own overrides, each checked: a run directory is a file anyone may have edited, and an override
    such as `+hydra.callbacks.x._target_=...` would run code when replayed. Only rlcli's keys are replayed."""
    path = run_dir / ".hydra" / "overrides.yaml"
    try:
        saved = OmegaConf.load(path)
    except Exception as error:
        raise ConfigError(f"cannot read {path}: {str(error).strip().splitlines()[0]}") from None
    if not isinstance(saved, ListConfig) or not all(isinstance(a, str) for a in saved):
        raise ConfigError(f"{path} is not a list of key=value overrides: the run directory was edited or damaged")
    roots, replayed = owned_roots(), []
    for arg in (str(a) for a in saved):
        key = _key(arg)
        if key in NOT_REPLAYED:
            if key == "trusted_checkpoint":
                _warn(f"{path} says trusted_checkpoint: it is not replayed; give it again on this command line "
                      "if you still trust the files that the run reads")
            continue
        if _root(key) not in roots or "_target_" in key or ("=" not in arg and not arg.startswith("~")):
            raise ConfigError(f"{path} holds {arg!r}, which is not an rlcli setting: refusing to replay it "
                              f"(a resume replays only keys under {', '.join(sorted(roots))})")
        replayed.append(arg)
    return replayed


def _new_overrides(rest: list[str]) -> list[str]:
    return [a for a in rest if _key(a) != "hydra.run.dir"]


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def incompatible_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """`key (old -> new)` for every difference outside CHANGEABLE."""
    saved = {"collector": {"name": "local"}, **saved}  # checkpoints from before collectors were a choice
    old, new = _flatten(saved), _flatten(current)
    changes = []
    for key in sorted(set(old) | set(new)):
        if key.startswith(CHANGEABLE) or old.get(key, "<unset>") == new.get(key, "<unset>"):
            continue
        changes.append(f"{key} ({old.get(key, '<unset>')!r} -> {new.get(key, '<unset>')!r})")
    return changes


def check_compatible(saved: dict[str, Any], current: dict[str, Any], path: Path) -> None:
    changes = incompatible_changes(saved, current)
    if changes:
        raise ConfigError(
            f"cannot resume {path.name} with a changed {', '.join(changes)}; only these may change on resume: "
            f"{', '.join(k.rstrip('.') + ('.*' if k.endswith('.') else '') for k in CHANGEABLE if k != 'resume')}"
        )
