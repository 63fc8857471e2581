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
from typing import NoReturn

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
def _hydra_entry(cfg: DictConfig) -> float:
    from hydra.core.hydra_config import HydraConfig

    from rlcli.trainer import Trainer

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        trainer = Trainer(cfg, run_dir)
    except ConfigError as error:
        _fail(error)
    return trainer.run()


def main(argv: list[str] | None = None) -> None:
    """Console entry point of `rl-train`."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        args = resume_args(args)
        if not any(a.startswith("-") for a in args):  # flags (--help, --cfg, -m) go straight to Hydra
            precheck(args)
    except ConfigError as error:
        _fail(error)
    sys.argv = [sys.argv[0], *args]
    _hydra_entry()


if __name__ == "__main__":
    main()
