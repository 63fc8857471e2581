"""`rl-eval`: measure a trained agent.

    rl-eval <run dir | checkpoint file | sweep dir> [load=best|last|<env steps>] [episodes=10]
            [deterministic=true] [seed=0] [num_envs=<episodes, at most 16>] [device=cpu] [env.<key>=<value> ...]

The agent is rebuilt from the checkpoint's own config (the source of truth) and its networks carry
the observation statistics, so it acts exactly as training tested it. `env.*` overrides run it on a
variant (`env.kwargs.x=...`, another `env.id` with the same spaces). Results print as a table and
go to `<run dir>/eval/<load>.json`; for a sweep directory every job's model is evaluated and the
jobs are listed best first. Bad input is one line and exit code 2, with nothing written.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

USAGE = __doc__.split("\n\n")[1]
OPTIONS = ("load", "episodes", "deterministic", "seed", "num_envs", "device")


@dataclass
class Result:
    run_dir: Path
    checkpoint: Path
    env_id: str
    returns: list[float]
    lengths: list[int]
    seconds: float

    def record(self, options: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        r = np.asarray(self.returns)
        return {"checkpoint": str(self.checkpoint), "env": self.env_id, **options, "episodes": len(r),
                "mean": float(r.mean()), "std": float(r.std()), "min": float(r.min()), "max": float(r.max()),
                "mean_length": float(np.mean(self.lengths)), "wall_s": round(self.seconds, 3),
                "returns": self.returns, "lengths": self.lengths}


def _fail(message: str) -> NoReturn:
    print(f"rl-eval: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def parse(argv: list[str]) -> tuple[Path, dict[str, Any], list[str]]:
    """(target, options, env overrides) from the command line; a one-line ConfigError when it does not parse."""
    from rlcli.registry import ConfigError, did_you_mean

    targets = [a for a in argv if "=" not in a]
    if len(targets) != 1:
        raise ConfigError(f"give one run directory, checkpoint file or sweep directory (got {len(targets)}); usage: "
                          "rl-eval <run dir> [load=best|last|<env steps>] [episodes=N] ...")
    options: dict[str, Any] = {"load": "best", "episodes": 10, "deterministic": True, "seed": 0, "num_envs": None,
                               "device": "cpu"}
    env_overrides = []
    for arg in argv:
        if "=" not in arg:
            continue
        key, value = arg.split("=", 1)
        if key.startswith("env."):
            env_overrides.append(arg)
            continue
        if key not in OPTIONS:
            raise ConfigError(f"unknown option '{key}'{did_you_mean(key, [*OPTIONS, 'env.id'])}; "
                              f"choose from: {', '.join(OPTIONS)}, env.<key>")
        options[key] = value
    for key in ("episodes", "seed", "num_envs"):
        if options[key] is not None and not isinstance(options[key], int):
            if not str(options[key]).lstrip("-").isdigit():
                raise ConfigError(f"{key}={options[key]!r} is invalid: expected an integer")
            options[key] = int(options[key])
    if options["episodes"] < 1 or (options["num_envs"] is not None and options["num_envs"] < 1):
        raise ConfigError("episodes and num_envs must be >= 1")
    if str(options["deterministic"]).lower() not in ("true", "false"):
        raise ConfigError(f"deterministic={options['deterministic']!r} is invalid: use true or false")
    options["deterministic"] = str(options["deterministic"]).lower() == "true"
    return Path(targets[0]).expanduser(), options, env_overrides


def is_run_dir(path: Path) -> bool:
    return (path / ".hydra" / "overrides.yaml").is_file() or (path / "checkpoints").is_dir()


def checkpoint_of(run_dir: Path, load: str) -> Path:
    """The checkpoint file that `load` names in a run directory."""
    from rlcli import checkpoint
    from rlcli.registry import ConfigError

    directory = run_dir / "checkpoints"
    if load == "best":
        path = directory / "best.pt"
        if not path.is_file():
            raise ConfigError(f"{run_dir} has no best model (checkpoints/best.pt): no test phase ran "
                              "(train.test_every=0?); use load=last")
        return path
    if load == "last":
        found = checkpoint.find_good(directory, warn=lambda m: None) if directory.is_dir() else None
        if found is None:
            raise ConfigError(f"{run_dir} has no usable checkpoint in checkpoints/")
        return found
    if not load.isdigit():
        raise ConfigError(f"load={load!r} is invalid: use best, last or a number of env steps")
    path = directory / f"ckpt_{int(load):012d}.pt"
    if not path.is_file():
        have = sorted(int(p.stem.split("_")[1]) for p in directory.glob("ckpt_*.pt"))
        raise ConfigError(f"load={load}: no checkpoint at {int(load):,} env steps in {directory}; "
                          f"there are: {', '.join(f'{s}' for s in have) or 'none'}")
    return path


def evaluate_checkpoint(path: Path, options: dict[str, Any], env_overrides: list[str]) -> Result:
    """Rebuild the agent of a checkpoint and run `episodes` episodes."""
    from omegaconf import OmegaConf

    from rlcli import checkpoint
    from rlcli.build import build_agent, section
    from rlcli.collector import evaluate
    from rlcli.registry import ENVS, ConfigError
    from rlcli.runtime import configure_torch, resolve_device, seed_everything
    from rlcli.weights import network_weights

    data = checkpoint.load(path)
    cfg = OmegaConf.create(data["config"])
    for override in env_overrides:
        key, value = override.split("=", 1)
        if OmegaConf.select(cfg, key, default="<missing>") == "<missing>" and not key.startswith("env.kwargs."):
            valid = sorted(str(k) for k in cfg.env)
            raise ConfigError(f"unknown key '{key}'; valid env keys: {', '.join(valid)}")
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([override]))  # values parse as YAML, as in rl-train
    device = resolve_device(options["device"])
    configure_torch(int(cfg.get("torch_threads", 1)), deterministic=False)
    seed_everything(options["seed"])
    env_factory = ENVS.build(section(cfg, "env"))
    episodes = options["episodes"]
    num_envs = min(options["num_envs"] or min(episodes, 16), episodes)
    envs = env_factory.make(num_envs, cfg.train.get("vector_mode", "auto"), eval=True)
    try:
        # the algorithm as training built it (its settings are checked against training's number of envs)
        agent = build_agent(cfg, env_factory, envs.single_observation_space, envs.single_action_space, device,
                            int(cfg.train.num_envs), with_addons=False)
        try:
            agent.algo.networks.load_state_dict(network_weights(data))
        except RuntimeError as error:
            detail = str(error).strip().splitlines()
            raise ConfigError(f"{path.name} does not fit env {env_factory.spec.id}: "
                              f"{(detail[1] if len(detail) > 1 else detail[0]).strip()}") from None
        agent.algo.networks.eval()
        returns: list[float] = []
        lengths: list[int] = []
        start, round_ = time.perf_counter(), 0
        while len(returns) < episodes:
            stats = evaluate(envs, agent.algo, agent.algo.networks.normalizer, device,
                             seed=options["seed"] + round_ * num_envs, obs_dtype=agent.obs_dtype,
                             carry_size=agent.carry_size, deterministic=options["deterministic"])
            returns += stats.returns.tolist()
            lengths += stats.lengths.tolist()
            round_ += 1
    finally:
        envs.close()
    return Result(path.parent.parent, path, env_factory.spec.id, returns[:episodes], lengths[:episodes],
                  time.perf_counter() - start)


def print_table(results: list[Result], title: str) -> None:
    import numpy as np
    from rich.console import Console
    from rich.table import Table

    from rlcli.log import fmt_return

    table = Table(title=title, header_style="bold cyan")
    for column in ("run", "env", "episodes", "return (mean ± std)", "min", "max", "mean length", "wall s"):
        table.add_column(column, justify="left" if column in ("run", "env") else "right", overflow="fold")
    for r in results:
        a = np.asarray(r.returns)
        table.add_row(str(r.run_dir), r.env_id, str(len(a)), f"{fmt_return(float(a.mean()))} ± {a.std():.1f}",
                      fmt_return(float(a.min())), fmt_return(float(a.max())), f"{np.mean(r.lengths):.0f}",
                      f"{r.seconds:.1f}")
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    console.print(table)


def main(argv: list[str] | None = None) -> None:
    """Console entry point of `rl-eval`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or any(a in ("-h", "--help") for a in argv):
        print(f"usage: {USAGE.strip()}\n\n{__doc__.split(chr(10) * 2, 2)[2]}")
        return
    from rlcli import checkpoint
    from rlcli.registry import ConfigError

    try:
        target, options, env_overrides = parse(argv)
        if target.is_file():
            jobs = [target]
        elif is_run_dir(target):
            jobs = [checkpoint_of(target, str(options["load"]))]
        elif target.is_dir():
            runs = sorted({p.parent.parent for p in target.rglob(".hydra/overrides.yaml")})
            runs = [r for r in runs if (r / "checkpoints").is_dir()]
            if not runs:
                raise ConfigError(f"{target} holds no run with checkpoints")
            jobs = [checkpoint_of(r, str(options["load"])) for r in runs]
        else:
            raise ConfigError(f"{target}: no such run directory, checkpoint file or sweep directory")
        results = [evaluate_checkpoint(path, options, env_overrides) for path in jobs]
    except (ConfigError, checkpoint.CheckpointError) as error:
        _fail(str(error))
    results.sort(key=lambda r: -sum(r.returns) / len(r.returns))
    shown = {k: v for k, v in options.items() if k != "device"}
    for r in results:
        out = r.run_dir / "eval"
        out.mkdir(exist_ok=True)
        name = f"{options['load'] if not target.is_file() else r.checkpoint.stem}"
        (out / f"{name}.json").write_text(json.dumps(r.record(shown | {"env_overrides": env_overrides}), indent=1))
    mode = "deterministic" if options["deterministic"] else "stochastic"
    print_table(results, f"rl-eval: {options['episodes']} {mode} episodes each, seed {options['seed']}")


if __name__ == "__main__":
    main()
