"""`rl-train`: compose the config with Hydra, check it, build the trainer, run it.

`resume=...` is turned into the run's own command line first (see resume.py). Before Hydra
creates or touches a run directory, `main` composes the config once with the Compose API and
builds the trainer from it (which also loads and checks a checkpoint to resume), so a typo in a
group choice, a key or a value type is one line on stderr (exit code 2) instead of Hydra's
multi-line report, and no run directory is made or changed for it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, NoReturn

import hydra
from omegaconf import DictConfig, OmegaConf

from rlcli.registry import ConfigError, did_you_mean
from rlcli.resume import resume_args

GROUPS = ("env", "algo", "actor", "buffer")


def conf_dir() -> str:
    """Absolute path of the configs: inside the wheel, else the source checkout's top-level conf/."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "conf", here.parents[1] / "conf"):
        if (candidate / "config.yaml").is_file():
            return str(candidate)
    raise FileNotFoundError("rlcli's conf/ directory is missing from this installation")


def group_options(group: str) -> list[str]:
    """Options of a config group; ids with a slash (ALE/Pong-v5) are nested files."""
    root = Path(conf_dir()) / group
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.yaml"))


def _fail(error: Exception) -> NoReturn:
    print(f"rl-train: error: {error}", file=sys.stderr)
    raise SystemExit(2)


def _check_group_choices(args: list[str]) -> None:
    for arg in args:
        key, sep, value = arg.partition("=")
        key = key.lstrip("+~")
        if sep and key in GROUPS:
            options = group_options(key)
            if value not in options:
                raise ConfigError(
                    f"unknown {key} '{value}'{did_you_mean(value, options)}; choose from: {', '.join(options)}"
                    + ("; any other gymnasium id: env=gym env.id=<id>" if key == "env" else "")
                )


def _explain_composition_error(error: Exception, args: list[str]) -> str:
    """Hydra's composition errors, cut down to one line that names the key and the valid ones."""
    text = str(error)
    bad_key = re.search(r"Could not override '([^']+)'", text)
    if bad_key and "not in struct" in str(error.__cause__ or ""):
        key = bad_key.group(1)
        parent, _, leaf = key.rpartition(".")
        if parent.endswith("kwargs"):  # a free-form mapping (env.kwargs): new keys need Hydra's `+`
            value = next((a.split("=", 1)[1] for a in args if a.split("=", 1)[0] == key), "<value>")
            return (f"'{key}' is not in the config yet; {parent} is passed to the env as given, so add the key "
                    f"with +{key}={value}")
        from hydra import compose

        base = compose("config", overrides=[a for a in args if a.split("=", 1)[0] in GROUPS])
        node = OmegaConf.select(base, parent) if parent else base
        valid = sorted(node.keys()) if isinstance(node, DictConfig) else []
        hint = did_you_mean(leaf, [str(v) for v in valid])
        return f"unknown key '{key}'{hint}; valid keys: {', '.join(map(str, valid))}"
    return text.strip().splitlines()[0]


def precheck(args: list[str]) -> None:
    """Compose the config and build the trainer the way the run will, raising a one-line ConfigError."""
    from hydra import compose, initialize_config_dir

    from rlcli.trainer import Trainer

    _check_group_choices(args)
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3", job_name="train"):
        try:
            cfg = compose("config", overrides=args)
        except Exception as error:  # Hydra raises several unrelated types for bad overrides
            raise ConfigError(_explain_composition_error(error, args)) from None
    # Building checks everything (ranges, env ids, devices, action spaces) and writes nothing.
    Trainer(cfg, run_dir=None).close()


@hydra.main(version_base="1.3", config_path=conf_dir(), config_name="config")
def _hydra_entry(cfg: DictConfig) -> Any:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from rlcli.trainer import Trainer

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    if hydra_cfg.mode == RunMode.MULTIRUN:
        from rlcli.sweep import run_job
        from rlcli.tuning import trial_reporter

        return run_job(cfg, run_dir, int(hydra_cfg.job.num), list(hydra_cfg.overrides.task), trial_reporter)
    try:
        trainer = Trainer(cfg, run_dir)
    except ConfigError as error:
        _fail(error)
    return trainer.run()


# pip packages of Hydra plugins a user may name without having installed them
PLUGIN_PACKAGES = {
    "hydra/launcher": {"joblib": "hydra-joblib-launcher (or rlcli[sweep])", "ray": "hydra-ray-launcher (or rlcli[ray])",
                       "submitit_local": "hydra-submitit-launcher", "submitit_slurm": "hydra-submitit-launcher",
                       "rq": "hydra-rq-launcher"},
    "hydra/sweeper": {"optuna": "hydra-optuna-sweeper (rlcli ships its own, with pruning: hydra/sweeper=rlcli_optuna)",
                      "nevergrad": "hydra-nevergrad-sweeper", "ax": "hydra-ax-sweeper"},
}


def _check_plugins(args: list[str]) -> None:
    """Name the pip package of a launcher or sweeper that is not installed, before composing."""
    from hydra.core.config_store import ConfigStore
    from hydra.core.plugins import Plugins

    Plugins.instance()  # imports the installed plugins, which register their configs
    for arg in args:
        key, _, value = arg.lstrip("+~").partition("=")
        if key in PLUGIN_PACKAGES:
            ours = [p.name for p in (Path(conf_dir()) / key).glob("*.yaml")]
            installed = sorted({n.removesuffix(".yaml") for n in [*ConfigStore.instance().list(key), *ours]})
            if value not in installed:
                package = PLUGIN_PACKAGES[key].get(value)
                raise ConfigError(f"{key}={value} is not installed" + (f": pip install {package}" if package else "")
                                  + f"; installed: {', '.join(installed)}")
    if any(_key(a) in ("hydra/sweeper", "hparams_search") for a in args):
        import importlib.util

        if importlib.util.find_spec("optuna") is None:
            raise ConfigError("the rlcli_optuna sweeper needs optuna: pip install optuna (or rlcli[sweep])")


def precheck_sweep(args: list[str]) -> None:
    """`-m`: check every job's config (each swept value, each end of a search space) before launching."""
    from hydra import compose, initialize_config_dir

    from rlcli.sweep import probe_combinations, search_space_probes

    resume = [_value(a) for a in args if _key(a) == "resume"]
    if resume and resume[-1] not in ("auto", "null", "None", ""):
        raise ConfigError(f"resume={resume[-1]!r} cannot apply to a sweep; finish a killed sweep with the same "
                          "command plus resume=auto hydra.sweep.dir=<its directory>")
    if resume and resume[-1] == "auto" and not any(_key(a) == "hydra.sweep.dir" for a in args):
        raise ConfigError("resume=auto with -m needs hydra.sweep.dir=<the sweep's directory> so that it finds the "
                          "jobs of the killed sweep")
    _check_plugins(args)
    args = [a for a in args if _key(a) != "resume"]
    hydra_args = [a for a in args if _key(a).startswith(("hydra.", "hydra/"))]
    job_args = [a for a in args if a not in hydra_args]
    try:
        combos = probe_combinations(job_args)
    except Exception as error:  # Hydra's override grammar: name the argument that does not parse
        bad = next((a for a in job_args if not _parses(a)), " ".join(job_args))
        raise ConfigError(f"cannot parse {bad!r}: {str(error).strip().splitlines()[0]}") from None
    _check_group_choices([a for combo in combos for a in combo])
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3", job_name="train"):
        try:
            full = compose("config", overrides=[*combos[0], *hydra_args], return_hydra_config=True)
        except Exception as error:
            raise ConfigError(_explain_composition_error(error, combos[0])) from None
    sweeper = full.hydra.sweeper
    ours = "rlcli" in str(sweeper.get("_target_", "")) and sweeper.get("params")
    probes = search_space_probes(OmegaConf.to_container(sweeper.params)) if ours else []
    for combo in [*combos, *([*combos[0], probe] for probe in probes)]:
        precheck(combo)


def _parses(arg: str) -> bool:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        OverridesParser.create().parse_override(arg)
    except Exception:
        return False
    return True


def _key(arg: str) -> str:
    return arg.split("=", 1)[0].lstrip("+~")


def _value(arg: str) -> str:
    return arg.split("=", 1)[1].strip().strip("'\"") if "=" in arg else ""


def _schedule_args(args: list[str]) -> list[str]:
    """`algo.schedules.X=...` (and `algo.policy_loss_addons.X...`) add keys to dicts that configs leave
    empty: make them `++`."""
    return [f"++{a}" if a.startswith(("algo.schedules.", "algo.policy_loss_addons.")) else a for a in args]


def main(argv: list[str] | None = None) -> None:
    """Console entry point of `rl-train`."""
    args = _schedule_args(list(sys.argv[1:] if argv is None else argv))
    multirun = any(a in ("-m", "--multirun") for a in args)
    try:
        if multirun:
            precheck_sweep([a for a in args if not a.startswith("-")])
        else:
            args = resume_args(args)
            if not any(a.startswith("-") for a in args):  # flags (--help, --cfg) go straight to Hydra
                precheck(args)
    except ConfigError as error:
        _fail(error)
    sys.argv = [sys.argv[0], *args]
    _hydra_entry()
    if multirun:
        from rlcli.sweep import failed_jobs

        if failed_jobs:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
