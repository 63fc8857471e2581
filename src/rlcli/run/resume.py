"""`rl-train resume=...`: find the run and checkpoint, rebuild its command line, check overrides.

Hydra rewrites `.hydra/` before the task runs, so resuming cannot simply point Hydra at an old
directory. Instead `resume_args` turns `resume=<run dir | checkpoint | auto>` into the run's own
saved overrides plus the new ones, with `hydra.run.dir` set to the run and `resume` set to the
checkpoint file. The checkpoint's stored config is the source of truth: `incompatible_changes`
lists what the new config changes that cannot change mid-run.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from rlcli.registry import ConfigError
from rlcli.services.log import fmt_return, say

# Keys that may differ between a checkpoint's config and the resumed run's.
CHANGEABLE = (
    "train.total_steps", "train.test_every", "train.test_episodes", "train.log_every", "train.tb_every",
    "train.stop_reward",
    "train.checkpoint_every", "train.step_timeout", "train.keep_checkpoints", "train.on_nonfinite",
    "train.max_nonfinite", "log.",
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
    TYPED_ON_RESUME.clear()
    RESUMED_BUDGET.clear()
    value = _value(resume[-1]) if resume else ""
    rest = [a for a in args if _key(a) != "resume"]
    run_dirs = [_value(a) for a in rest if _key(a) == "hydra.run.dir"]
    if value.lower() in ("", "null", "none"):
        if run_dirs and run_dirs[-1] and not any(a.startswith("-") for a in rest):  # (not --cfg, --help: no run)
            check_not_a_run(Path(run_dirs[-1]), run_dirs[-1])
        return rest
    from rlcli.services import checkpoint  # imports torch: only when resuming, so `rl-train --help` stays fast

    TYPED_ON_RESUME.update(_key(a) for a in rest if "=" in a and not a.startswith("-"))
    if value == "auto":
        if not run_dirs:
            raise ConfigError("resume=auto needs hydra.run.dir=<run dir> so that a re-queued job finds its own run")
        run_dir = Path(run_dirs[-1]).resolve()
        ckpt = checkpoint.find_good(run_dir / "checkpoints", warn=_warn) if run_dir.is_dir() else None
        if ckpt is None:
            check_not_a_sweep(run_dir, f"hydra.run.dir={run_dirs[-1]}")
            return rest  # nothing to resume yet: start fresh in that directory
    else:
        target = Path(value).expanduser().resolve()
        if target.is_file():
            checkpoint.verify(target)  # an explicitly named checkpoint must be good; no silent fallback
            ckpt, run_dir = target, target.parent.parent
        elif target.is_dir():
            run_dir = target
            if is_sweep_dir(run_dir):
                raise ConfigError(f"resume={value} is a sweep's directory: resume one of its jobs with resume="
                                  f"{value.rstrip('/')}/<job>, or finish the sweep with its command plus resume=auto "
                                  f"hydra.sweep.dir={value}")
            ckpt = checkpoint.find_good(run_dir / "checkpoints", warn=_warn)
        else:
            raise ConfigError(f"resume={value!r}: no such run directory or checkpoint file")
        if run_dirs and Path(run_dirs[-1]).expanduser().resolve() != run_dir:
            raise ConfigError(f"resume={value} continues {run_dir} in place, and hydra.run.dir={run_dirs[-1]} cannot "
                              "move it: drop hydra.run.dir (to branch a run, copy its directory and resume the copy)")
        never_trained = not any((run_dir / "checkpoints").glob("ckpt_*.pt"))  # stopped during start-up
        if ckpt is None and never_trained and (run_dir / ".hydra" / "overrides.yaml").is_file():
            from rlcli.run import lock

            lock.acquire(run_dir)  # a run still starting in another process: that, not "starting it fresh" first
            _warn(f"{run_dir} has no checkpoint yet (it stopped before training): starting it fresh")
            return [*_saved_overrides(run_dir, rest), *_new_overrides(rest), f"hydra.run.dir={_quote(run_dir)}"]
        if ckpt is None:
            raise ConfigError(f"resume={value!r}: no usable checkpoint in {run_dir / 'checkpoints'}")
    saved_path = run_dir / ".hydra" / "overrides.yaml"
    if not saved_path.is_file():
        raise ConfigError(f"resume={value!r}: {run_dir} is not an rl-train run directory (no .hydra/overrides.yaml)")
    _check_same_choices(run_dir, rest, value)
    budget = _saved_budget(run_dir)
    if budget is not None:
        RESUMED_BUDGET["total_steps"] = budget
    return [*_saved_overrides(run_dir, rest), *_new_overrides(rest), f"hydra.run.dir={_quote(run_dir)}",
            f"resume={_quote(ckpt)}"]


def _check_same_choices(run_dir: Path, rest: list[str], value: str) -> None:
    """algo=, env=, actor= or collector= naming another config than the run's: one line that says so (the resume
    refused the settings that choice changed, and blamed rlcli's shipped settings for them)."""
    import yaml

    try:
        hydra_config = yaml.safe_load((run_dir / ".hydra" / "hydra.yaml").read_text()) or {}
        choices = hydra_config["hydra"]["runtime"]["choices"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return
    for group, what in (("algo", "algorithm"), ("env", "env"), ("actor", "network"), ("collector", "collector")):
        typed = [_value(a) for a in rest if _key(a) == group]
        if typed and group in choices and typed[-1] != str(choices[group]):
            raise ConfigError(f"resume={value}: the run is {group}={choices[group]}, and {group}={typed[-1]} would "
                              f"change its {what}, which a resume cannot: start a new run with it (actor.init_from="
                              f"<this run's checkpoint> copies its weights where the networks fit)")


# The resumed run's own budget (its saved train.total_steps), set by resume_args: a resume whose budget is below it
# and at or below the steps taken trains nothing (budget_passed).
RESUMED_BUDGET: dict[str, int] = {}


def saved_setting(run_dir: Path, group: str, key: str) -> Any:
    """One setting of a run's saved config (None when it cannot be read)."""
    import yaml

    try:
        config = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text()) or {}
        return config.get(group, {}).get(key)
    except (OSError, yaml.YAMLError, AttributeError):
        return None


def _saved_budget(run_dir: Path) -> int | None:
    total = saved_setting(run_dir, "train", "total_steps")
    return total if isinstance(total, int) and not isinstance(total, bool) else None


def budget_passed(state: Any, total_steps: int) -> bool:
    """Nothing to train: the run finished at or past `total_steps`, or it stopped past it and this resume lowered
    the budget below the run's own. A stopped run finishes (its final test, `finished`) when the budget is its own
    (a job killed after its last checkpoint, re-queued) or exactly the steps it has taken (finish it there)."""
    if state.finished:
        return 0 < state.env_steps >= total_steps
    own = RESUMED_BUDGET.get("total_steps")
    return state.env_steps > total_steps and own is not None and total_steps < own


def is_sweep_dir(directory: Path) -> bool:
    """Hydra writes multirun.yaml at a -m sweep's root."""
    return (directory / "multirun.yaml").is_file()


def check_not_a_sweep(directory: Path, named: str) -> None:
    if is_sweep_dir(directory):
        raise ConfigError(f"{named} is a sweep's directory (multirun.yaml): a run of its own needs another "
                          f"hydra.run.dir (resume={directory}/<job> continues one of its jobs)")


def check_not_a_run(run_dir: Path, named: str) -> None:
    """A fresh run in a directory that holds a trained one would replace its best model, eval.jsonl and latest
    checkpoint (Hydra reuses a run dir as it is, `~` unexpanded): one line naming the ways on instead."""
    checkpoints = run_dir / "checkpoints"
    if held := sorted(checkpoints.glob("ckpt_*.pt")):
        raise ConfigError(f"hydra.run.dir={named} already holds a trained run (checkpoints/{held[-1].name}): "
                          f"resume=auto (or resume={named}) continues it; to start over, remove the directory "
                          "or choose another hydra.run.dir")
    if (checkpoints / "best.pt").is_file():
        raise ConfigError(f"hydra.run.dir={named} holds a run's best model (checkpoints/best.pt) but no checkpoint to "
                          "resume from: to start over, remove the directory or choose another hydra.run.dir")
    check_not_a_sweep(run_dir, f"hydra.run.dir={named}")


# Saved overrides that are permissions of one invocation, never replayed from a run directory.
NOT_REPLAYED = ("resume", "hydra.run.dir", "trusted_checkpoint")

# The keys given on the resume command line (resume_args): only these may change the settings that a resume changes
# on request only (changes_on_request); a replayed value or a changed shipped default never does.
TYPED_ON_RESUME: set[str] = set()


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


def _saved_overrides(run_dir: Path, typed: list[str] | None = None) -> list[str]:
    """The run's own overrides, each checked: a run directory is a file anyone may have edited, and replaying an
    override such as `+hydra.callbacks.x._target_=...`, `hparams_search=../../x` (a yaml file from anywhere, which may
    set Hydra's callbacks) or `algo.lr=${oc.env:SECRET}` would run code or read this machine. Only an override that
    rlcli's own command line could have written is replayed (see `why_not_replayed`); anything else is refused in
    one line naming the file's line. `typed`: this command line, whose overrides replace saved ones of the same key."""
    path = run_dir / ".hydra" / "overrides.yaml"
    import yaml

    try:  # plain YAML: OmegaConf would resolve an item's `${...}` as it reads it
        text = path.read_text()
        saved = yaml.safe_load(text)
    except Exception as error:
        raise ConfigError(f"cannot read {path}: {str(error).strip().splitlines()[0]}") from None
    if not isinstance(saved, list) or not all(isinstance(a, str) for a in saved):
        raise ConfigError(f"{path} is not a list of key=value overrides: the run directory was edited or damaged")
    typed = [a for a in typed or [] if not a.startswith("-")]
    given_again = {_key(a) for a in typed if "=" in a}
    trusted = any(_key(a) == "trusted_checkpoint" and _value(a).lower() == "true" for a in typed)
    context = ReplayContext(owned_roots(), _groups(), search_path_of(typed), given_again, trusted)
    lines, replayed = _line_numbers(text, len(saved)), []
    for index, arg in enumerate(str(a) for a in saved):
        key = _key(arg)
        if key in NOT_REPLAYED:
            if key == "trusted_checkpoint":
                _warn(f"{path} says trusted_checkpoint: it is not replayed; give it again on this command line "
                      "if you still trust the files that the run reads")
            continue
        why = why_not_replayed(arg, context)
        if why == REPLACED:
            continue
        if why is not None:
            raise ConfigError(f"{path} line {lines[index]} ({arg!r}) is not an override rlcli would have written: "
                              f"{why}; nothing was run or changed (remove that line to resume)")
        replayed.append(arg)
    return replayed


@dataclass(frozen=True)
class ReplayContext:
    """What a saved override is checked against: rlcli's keys and groups, the command line's search path, the keys
    given again on this command line and whether it says trusted_checkpoint=true."""

    roots: set[str]
    groups: set[str]
    search_path: list[str]
    given_again: set[str]
    trusted: bool
    options: dict[str, list[str]] = field(default_factory=dict)  # each group's options, walked once


REPLACED = "<given again on this command line>"
# a resolver call in a value: `${oc.env:HOME}`, `${oc.decode:...}`, `${now:...}`, `${hydra:...}`; a plain reference
# to another setting (`${algo.lr}`) is allowed
_REFERENCE = re.compile(r"\$\{[A-Za-z0-9_.\-\[\]]+\}")


def why_not_replayed(arg: str, context: ReplayContext) -> str | None:
    """Why `arg` (a line of a run's .hydra/overrides.yaml) must not be replayed, or None. REPLACED: it need not be,
    as this command line gives its key again (only for a value that is refused for what it reads or imports)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        override = OverridesParser.create().parse_override(arg)
    except Exception:
        return "it does not parse as a key=value override"
    key, package = override.key_or_group, override.package
    if override.is_sweep_override():
        return "a sweep (a,b / range / glob) is never the override of one run"
    if package is not None:
        return f"'{key}@{package}' puts a config into another package, which rlcli's command line never does"
    if _root(key) not in context.roots or key.split(".", 1)[0] == "hydra":
        return (f"{key} is not an rlcli setting (a resume replays only keys under "
                f"{', '.join(sorted(context.roots))})")
    if "/" in key:
        return f"{key} names a config group's folder, which rlcli's command line never does"
    if "_target_" in key or _has_target(override.value()):
        return "_target_ names code to run, which no rlcli setting does"
    if key in context.groups:
        return _group_value_problem(key, override, context)
    if "=" not in arg:
        return None if arg.startswith("~") else "it has no value"
    value = override.value()
    called = _resolver_call(value)
    if called is not None:
        if key in context.given_again:
            return REPLACED
        return (f"{called} calls a resolver, which reads this machine when the config is resolved (a replayed value "
                f"may only refer to another setting, as ${{algo.lr}}); give {key}=<value> on this command line "
                "instead")
    if key == "dataset" and not (value is None or (isinstance(value, str) and "${" not in value)):
        if key in context.given_again:
            return REPLACED
        return (f"dataset={value!r} is not a plain path or id (a replayed dataset= names a file or a Minari id, "
                "nothing else); give dataset=<path or id> on this command line instead")
    if key == "env.id":  # rlcli.train(env=<function>) wrote it: only Python can give that function again
        from rlcli.envs import python_env_missing, python_env_unknown

        if python_env_unknown(value):
            raise ConfigError(python_env_missing(str(value)))
    if key == "env.id" and (":" in str(value) or "${" in str(value)):  # (a reference could name a module too)
        if context.trusted:
            return None
        if key in context.given_again:
            return REPLACED
        if "${" in str(value):
            return (f"env.id {value!r} takes its value from another setting, which could name a module to import; "
                    "give env.id=<id> on this command line instead")
        module = str(value).split(":", 1)[0]
        return (f"env.id {value!r} imports the module {module!r}, and a resume imports nothing that a file names: "
                f"give env.id={value} again on this command line if you trust that module")
    address = str(value).lower()
    if key == "collector.address" and ("${" in address or address not in ("", "none", "null", "local")):
        if key in context.given_again:
            return REPLACED
        return (f"it joins the Ray cluster at {value}, whose replies are unpickled here: give collector.address="
                f"{value} again on this command line if you trust that cluster")
    return None


def _group_value_problem(group: str, override: Any, context: ReplayContext) -> str | None:
    """A config group's choice must be one of that group's options (no path parts: `..`, `/x`)."""
    from rlcli.run.compose import group_options

    if override.is_delete():
        return None
    value = override.value()
    if value is None and group in ("tuned", "hparams_search"):  # the optional groups: none
        return None
    if group not in context.options:
        context.options[group] = group_options(group, context.search_path)
    options = context.options[group]
    if isinstance(value, str) and value in options:
        return None
    shown = ", ".join(options[:12]) + (f", ... ({len(options)} in all)" if len(options) > 12 else "")
    return f"{value!r} is not an option of the config group {group} (options: {shown})"


def _has_target(value: Any) -> bool:
    if isinstance(value, dict):
        return any(str(k) == "_target_" or _has_target(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_target(v) for v in value)
    return False


def _resolver_call(value: Any) -> str | None:
    """The first interpolation in `value` that is not a plain reference to a setting (a resolver call), or None."""
    if isinstance(value, dict):
        found = [_resolver_call(v) for v in [*value.keys(), *value.values()]]
        return next((f for f in found if f), None)
    if isinstance(value, list):
        return next((f for f in map(_resolver_call, value) if f), None)
    if isinstance(value, str) and "${" in _REFERENCE.sub("", value):
        start = value.index("${")
        return value[start:value.find("}", start) + 1 or len(value)]
    return None


def _groups() -> set[str]:
    """rlcli's config groups (conf/'s folders): a replayed choice of one is checked against its options."""
    from rlcli.run.compose import conf_dir

    return {p.name for p in Path(conf_dir()).iterdir() if p.is_dir() and p.name != "hydra"}


def search_path_of(args: list[str]) -> list[str]:
    """The `hydra.searchpath` of this command line (with `--config-dir`), where group options may come from."""
    from rlcli.run.compose import search_path_args, with_config_dirs

    overrides = with_config_dirs(list(args))
    return search_path_args(overrides if overrides is not None else [a for a in args if not a.startswith("-")])


def _line_numbers(text: str, count: int) -> list[int]:
    """The file's line number of each item of the saved list (comments and blank lines counted)."""
    import yaml

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        numbers = [item.start_mark.line + 1 for item in node.value] if node is not None else []
    except Exception:
        numbers = []
    return numbers if len(numbers) == count else list(range(1, count + 1))


def _new_overrides(rest: list[str]) -> list[str]:
    return [a for a in rest if _key(a) != "hydra.run.dir"]


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


# Settings a multi-agent run saved before they existed had, by their meaning then.
ADDED_SINCE = {"env.groups": None}


def incompatible_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """`key (old -> new)` for every difference outside CHANGEABLE."""
    return [f"{key} ({old!r} -> {new!r})" for key, old, new in differences(saved, current)]


def differences(saved: dict[str, Any], current: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, old, new) for every difference outside CHANGEABLE; '<unset>' where a side lacks the key."""
    saved = {"collector": {"name": "local"}, **saved}  # checkpoints from before collectors were a choice
    old, new = _flatten(saved), _flatten(current)
    # An algo setting its yaml left out then (it now shows every constructor setting) had the constructor's default.
    from rlcli.run.algo_defaults import algo_defaults

    unstated = algo_defaults().get(str(saved.get("algo", {}).get("name")), {})
    old = {**{f"algo.{k}": v for k, v in unstated.items() if f"algo.{k}" in new}, **old}
    if saved.get("env", {}).get("name") in ("pz", "vmas"):  # keys added since, whose default is the old behaviour
        old = {**{key: value for key, value in ADDED_SINCE.items() if key in new}, **old}
    return [(key, old.get(key, "<unset>"), new.get(key, "<unset>")) for key in sorted(set(old) | set(new))
            if not key.startswith(CHANGEABLE) and old.get(key, "<unset>") != new.get(key, "<unset>")]


# The optimizer's settings: a resume that gives them writes them into the loaded optimizer's parameter groups.
OPTIMIZER_KEYS = ("algo.lr", "algo.lr_pi", "algo.lr_v")
ON_REQUEST = ("algo.lr, algo.lr_pi, algo.lr_v, algo.schedules.* and the algorithm's schedulable numbers "
              "(algo.ent_coef, algo.max_grad_norm, ...)")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def changes_on_request(key: str, old: Any, new: Any, algo: Any) -> bool:
    """Whether a resume may change `key` when its command line asks for it: the optimizer's learning rates, the
    schedules (functions of the run's progress, kept in no state) and the numbers the algorithm declares
    schedulable (values a schedule may already move mid-run). None of them changes a shape; sizes, counts, the env
    and the networks are never among them."""
    if key.startswith("algo.schedules."):
        return True
    if algo is None:
        return False
    if key in OPTIMIZER_KEYS:
        return bool(algo.optimizers()) and (_number(new) or new is None) and (_number(old) or old is None)
    name = key.removeprefix("algo.")
    return key.startswith("algo.") and name in algo.schedulable and _number(old) and _number(new)


def check_compatible(saved: dict[str, Any], current: dict[str, Any], path: Path,
                     algo: Any = None) -> list[tuple[str, Any, Any]]:
    """The changes a resume from `path` makes that the user asked for (CHANGE_ON_REQUEST keys given on the resume
    command line: the run then goes on, but not as an exact continuation); a one-line ConfigError for any other."""
    allowed: list[tuple[str, Any, Any]] = []
    refused: list[tuple[str, Any, Any]] = []
    not_given: list[tuple[str, Any, Any]] = []
    for key, old, new in differences(saved, current):
        if changes_on_request(key, old, new, algo):
            (allowed if key in TYPED_ON_RESUME else not_given).append((key, old, new))
        else:
            refused.append((key, old, new))
    schedules = current.get("algo", {}).get("schedules") or {}
    shadowed = [key for key, _, _ in allowed if key in OPTIMIZER_KEYS and "lr" in schedules]
    if shadowed:
        raise ConfigError(f"{shadowed[0]} has no effect on this run: algo.schedules.lr={schedules['lr']} sets every "
                          "learning rate; change algo.schedules.lr on the resume command line instead")
    if refused or not_given:
        listed = ", ".join(f"{key} ({old!r} -> {new!r})" for key, old, new in [*refused, *not_given])
        hint = (f"; and, when given on the resume command line (the run then is no longer an exact continuation): "
                f"{ON_REQUEST}")
        if not refused:  # a shipped default changed (another rlcli), not this command line
            hint = f"; give {not_given[0][0]}=<value> on the resume command line to change it on purpose"
        if not any(key in TYPED_ON_RESUME for key, _, _ in [*refused, *not_given]):
            hint += ("; none of these was given on this command line, so rlcli's shipped settings changed since the "
                     "run was made: where a tuned preset (conf/tuned/<algo>/<env>.yaml) now applies, ~tuned on the "
                     "resume command line leaves it out")
        raise ConfigError(
            f"cannot resume {path.name} with a changed {listed}; only these may change on resume: "
            f"{', '.join(k.rstrip('.') + ('.*' if k.endswith('.') else '') for k in CHANGEABLE if k != 'resume')}"
            + hint
        )
    return allowed


@contextmanager
def new_settings_kept(algo: Any, changes: list[tuple[str, Any, Any]]) -> Iterator[None]:
    """Around loading a checkpoint into `algo` (built from the resume's config): the changed settings keep their
    new values. The optimizer's parameter groups are saved with their learning rates (and the `base_lr` that
    `lr_schedule` scales), which loading would bring back; a schedulable value the algorithm keeps in its state
    (ppo_kl's kl_coef) likewise."""
    keys = {key for key, _, _ in changes}
    rates = [[{k: group[k] for k in ("lr", "base_lr") if k in group} for group in optimizer.param_groups]
             for optimizer in algo.optimizers()] if keys & set(OPTIMIZER_KEYS) else []
    names = [key.removeprefix("algo.") for key in keys if key.removeprefix("algo.") in algo.schedulable]
    # algo.groups: a group's own value of a changed setting (`<group>.<name>`) is put back after the run's
    names += [name for name in algo.schedulable if "." in name and name.rpartition(".")[2] in names]
    values = {name: copy.deepcopy(getattr(algo, name)) for name in names}
    yield
    for optimizer, fresh_groups in zip(algo.optimizers(), rates, strict=False):
        for group, fresh in zip(optimizer.param_groups, fresh_groups, strict=True):
            group["lr"] = fresh["lr"]
            if "base_lr" in group or "base_lr" in fresh:
                group["base_lr"] = fresh.get("base_lr", fresh["lr"])
    for name, value in values.items():
        setattr(algo, name, value)


def change_record(changes: list[tuple[str, Any, Any]], env_steps: int, checkpoint_name: str) -> dict[str, Any]:
    """What a run's state keeps of a resume that changed settings (checkpoints carry the list on)."""
    return {"env_steps": env_steps, "checkpoint": checkpoint_name,
            "settings": {key: [None if old == "<unset>" else old, None if new == "<unset>" else new]
                         for key, old, new in changes}}


def describe_change(record: dict[str, Any]) -> str:
    """`algo.lr 0.0003 -> 0.0001 at 1,024 env steps`."""
    settings = ", ".join(f"{key} {_shown(old)} -> {_shown(new)}" for key, (old, new) in record["settings"].items())
    return f"{settings} at {int(record['env_steps']):,} env steps"


def _shown(value: Any) -> str:
    """A value as a line shows it: a checkpoint's string with control characters (a terminal's escapes) quoted."""
    text = str(value)
    return text if text.isprintable() else repr(text)


def change_notice(record: dict[str, Any]) -> str:
    """The one line a changed resume prints (and train.log keeps)."""
    return (f"resumed from {record['checkpoint']} with {describe_change(record)}, as this command line asks: the "
            "run is no longer an exact continuation (its checkpoints keep this change in state.changes)")


# A resumed run that had finished (its budget or its stop reward reached), by what the resume command line asks:
DONE = "done"  # nothing to train: the run directory is left as it was (Hydra writes nothing into its .hydra/)
PAST_STOP_REWARD = "past_stop_reward"  # train on to the raised budget, the stop reward it reached switched off


def finished_run_plan(state: Any, total_steps: int, stop_reward: float | None, typed: set[str]) -> str | None:
    """DONE, PAST_STOP_REWARD, or None (the run trains: it had not finished, or the resume asks for more).

    A finished run trains on when the resume command line asks for it: a train.total_steps above its env steps (a
    raised budget), or a train.stop_reward that its last test return has not reached (a higher one, or null). A
    raised budget alone, on a run whose last test return reached its stop reward, trains on with the stop reward
    off (the first test phase would stop it again): PAST_STOP_REWARD, which adds train.stop_reward=null."""
    if budget_passed(state, total_steps):
        return DONE
    if not state.finished:
        return None
    last = state.last_test_return
    if stop_reward is None or last is None or last < stop_reward:
        return None
    if "train.total_steps" in typed and "train.stop_reward" not in typed:
        return PAST_STOP_REWARD
    return DONE


def already_done_line(state: Any, total_steps: int, stop_reward: float | None, python: bool = False) -> str:
    """Why a resume of a finished run trains nothing, and what would train it on (`python`: rlcli.train's words)."""
    last = fmt_return(state.last_test_return)
    above = "more_steps=<n>" if python else f"train.total_steps above {state.env_steps:,}"
    if not state.finished:  # stopped (a signal, a kill) at or past the budget this resume gives
        return (f"this run stopped at {state.env_steps:,} env steps (test return {last}), and train.total_steps="
                f"{total_steps:,} is below that: nothing to train (nothing was changed); resume without "
                f"train.total_steps to finish its own budget, train.total_steps={state.env_steps} to finish it where "
                f"it is, or {above}")
    done = f"this run already finished at {state.env_steps:,} env steps (test return {last})"
    if state.env_steps >= total_steps:
        return f"{done}; to train longer, give {above} (nothing was changed)"
    return (f"{done}: it reached train.stop_reward={stop_reward:g}; to train on, give a higher train.stop_reward (or "
            f"null), or train.total_steps=<a budget> alone (nothing was changed)")


def past_stop_reward_line(state: Any, total_steps: int, stop_reward: float) -> str:
    return (f"this run reached its stop reward at {state.env_steps:,} env steps (test return "
            f"{fmt_return(state.last_test_return)} >= {stop_reward:g}): it trains on to train.total_steps="
            f"{total_steps:,} with train.stop_reward=null (give train.stop_reward=<a return> to stop at one)")
