"""`rl-eval`: measure, watch and export a trained agent.

    rl-eval <run dir | checkpoint file | sweep dir> [load=best|last|<env steps>] [episodes=10]
            [deterministic=true] [seed=0] [num_envs=<episodes, at most 16>] [device=cpu] [env.<key>=<value> ...]
            [video=true [video_episodes=1] [video_format=mp4|gif] [video_concat=false]]
            [export=onnx|torchscript] [trusted_checkpoint=false]

The agent is rebuilt from the checkpoint's own config (the source of truth) and its networks carry
the observation statistics, so it acts exactly as training tested it. Episode i starts from seed
`seed + i`. `env.*` overrides run it on a variant (`env.kwargs.x=...`, another `env.id` with the same
spaces). Results print as a table and go to `<run dir>/eval/<load>.json`; for a sweep directory every
job's model is evaluated and the jobs are listed best first.

video=true also records the first `video_episodes` episodes (the same seeds, so the same episodes as
the table's first ones) headless to `<run dir>/videos/<load>-ep<i>-return<R>.mp4` (or .gif; with
video_concat=true one file of them all). Needs `pip install -e '.[video]'`.

export=onnx|torchscript writes `<run dir>/export/<load>.onnx` (or .pt) instead of evaluating: a
standalone deterministic policy, raw observation -> env action, with the observation normalization
and the action clipping or rescaling folded in (a recurrent policy: carry in, next carry out), plus a
JSON of its inputs and outputs. It is then checked as its user would run it (onnxruntime, torch.jit):
its actions against rlcli's on 1,000 env observations, and one episode's return. ONNX needs
`pip install -e '.[export]'`.

Reading a checkpoint never runs code from it: only tensors and plain values are read. A format-1
checkpoint (rlcli before the safe format, a full pickle) is read only with trusted_checkpoint=true,
which says that you trust whoever wrote the file.

Bad input is one line and exit code 2, with nothing written.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from rlcli.os_errors import describe_os_error

USAGE = __doc__.split("\n\n")[1]
OPTIONS = ("load", "episodes", "deterministic", "seed", "num_envs", "device", "video", "video_episodes", "video_format",
           "video_concat", "export", "trusted_checkpoint")
BOOLEANS = ("deterministic", "video", "video_concat", "trusted_checkpoint")


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


def _fail(message: str, code: int = 2) -> NoReturn:
    print(f"rl-eval: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def parse(argv: list[str]) -> tuple[Path, dict[str, Any], list[str]]:
    """(target, options, env overrides) from the command line; a one-line ConfigError when it does not parse."""
    from rlcli.compose import as_key_value
    from rlcli.registry import ConfigError, did_you_mean

    for i, arg in enumerate(argv):
        if arg.startswith("-"):
            raise ConfigError(f"unknown flag {arg!r}: rl-eval takes key=value options, e.g. "
                              f"{as_key_value(arg, argv[i + 1] if i + 1 < len(argv) else None)}")
    targets = [a for a in argv if "=" not in a]
    if len(targets) != 1:
        raise ConfigError(f"give one run directory, checkpoint file or sweep directory (got {len(targets)}); usage: "
                          "rl-eval <run dir> [load=best|last|<env steps>] [episodes=N] ...")
    options: dict[str, Any] = {"load": "best", "episodes": 10, "deterministic": True, "seed": 0, "num_envs": None,
                               "device": "cpu", "video": False, "video_episodes": 1, "video_format": "mp4",
                               "video_concat": False, "export": None,
                               "trusted_checkpoint": False}
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
    for key in ("episodes", "seed", "num_envs", "video_episodes"):
        if options[key] is not None and not isinstance(options[key], int):
            if not str(options[key]).lstrip("-").isdigit():
                raise ConfigError(f"{key}={options[key]!r} is invalid: expected an integer")
            options[key] = int(options[key])
    if not 0 <= options["seed"] < 2**32:
        raise ConfigError(f"seed={options['seed']} is invalid: must be between 0 and 2**32 - 1 (numpy's seed range)")
    if options["episodes"] < 1 or options["video_episodes"] < 1 or (options["num_envs"] is not None
                                                                    and options["num_envs"] < 1):
        raise ConfigError("episodes, video_episodes and num_envs must be >= 1")
    for key in BOOLEANS:
        if str(options[key]).lower() not in ("true", "false"):
            raise ConfigError(f"{key}={options[key]!r} is invalid: use true or false")
        options[key] = str(options[key]).lower() == "true"
    if options["video"]:  # the videos are the evaluation's first episodes: a first round holds them all
        options["episodes"] = max(options["episodes"], options["video_episodes"])
        if options["num_envs"] is not None:
            options["num_envs"] = max(options["num_envs"], options["video_episodes"])
    from rlcli import policy_export as export
    from rlcli import video

    if options["video"]:
        video.require_encoder(options["video_format"])
    if options["export"] is not None:
        if options["export"] not in export.FORMATS:
            raise ConfigError(f"export={options['export']!r} is not a format; choose from: {', '.join(export.FORMATS)}")
        if options["export"] == "onnx":
            export.require("onnx", "onnxscript", "onnxruntime")
        if options["video"]:
            raise ConfigError("export=... writes a file instead of evaluating; run video=true separately")
    return Path(targets[0]).expanduser(), options, env_overrides


def is_run_dir(path: Path) -> bool:
    return (path / ".hydra" / "overrides.yaml").is_file() or (path / "checkpoints").is_dir()


def env_of(run_dir: Path) -> str:
    """The env id a run trained on, from its saved config (`?` when it cannot be read)."""
    import yaml

    try:
        config = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text()) or {}
        return str(config.get("env", {}).get("id", "?"))
    except (OSError, yaml.YAMLError, AttributeError):
        return "?"


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


@dataclass
class Loaded:
    """A checkpoint's agent, rebuilt as training built it, with the env factory of its (overridden) config."""

    path: Path
    cfg: Any
    env_factory: Any
    agent: Any
    device: Any


def load_agent(path: Path, options: dict[str, Any], env_overrides: list[str]) -> Loaded:
    from omegaconf import OmegaConf

    from rlcli import checkpoint
    from rlcli.agent import build_agent, section
    from rlcli.registry import ALGOS, ENVS, ConfigError
    from rlcli.runtime import configure_torch, resolve_device, seed_everything
    from rlcli.weights import network_weights

    data = checkpoint.load(path, trusted=options.get("trusted_checkpoint", False))
    checkpoint.require(data, path, "config", "algo")
    cfg = OmegaConf.create(data["config"])
    for override in env_overrides:
        key, value = override.split("=", 1)
        if OmegaConf.select(cfg, key, default="<missing>") == "<missing>" and not key.startswith("env.kwargs."):
            valid = sorted(str(k) for k in cfg.env)
            raise ConfigError(f"unknown key '{key}'; valid env keys: {', '.join(valid)}")
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([override]))  # values parse as YAML, as in rl-train
    device = resolve_device(options["device"])
    if options.get("configure_torch", True):  # rl-eval's process is its own; rlcli.load() leaves torch's settings
        configure_torch(int(cfg.get("torch_threads", 1)), deterministic=False)
    if options.get("seed") is not None:
        seed_everything(options["seed"])
    env_factory = ENVS.build(section(cfg, "env"))
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
    except RuntimeError as error:
        detail = str(error).strip().splitlines()
        raise ConfigError(f"{path.name} does not fit env {env_factory.spec.id}: "
                          f"{(detail[1] if len(detail) > 1 else detail[0]).strip()}") from None
    from rlcli.finite import nonfinite_weights

    bad = nonfinite_weights([*agent.algo.networks.named_parameters(), *agent.algo.networks.named_buffers()])
    if bad:
        raise ConfigError(f"{path} holds non-finite network weights ({', '.join(bad[:3])}): the run diverged "
                          "before it was saved; evaluate or export an earlier checkpoint (load=<env steps>)")
    agent.algo.networks.eval()
    return Loaded(path, cfg, env_factory, agent, device)


def evaluate_checkpoint(loaded: Loaded, options: dict[str, Any], name: str) -> tuple[Result, list[Any]]:
    """Run `episodes` episodes (episode i from seed `seed + i`); with video=true the first round of envs
    renders, and the first `video_episodes` of its episodes are written to <run dir>/videos/."""
    from rlcli import video
    from rlcli.collector import evaluate

    agent, episodes = loaded.agent, options["episodes"]
    num_envs = min(options["num_envs"] or min(episodes, 16), episodes)
    mode = loaded.cfg.train.get("vector_mode", "auto")
    masks = agent.spec.action_masks
    envs = loaded.env_factory.make(num_envs, mode, eval=True, render=options["video"], masks=masks)
    sink = None
    if options["video"]:
        sink = video.VideoSink(loaded.path.parent.parent / "videos", name, options["video_format"],
                               video.frames_per_second(envs), options["video_episodes"], options["video_concat"])
    recordings: list[Any] = []
    try:
        returns: list[float] = []
        lengths: list[int] = []
        start, round_ = time.perf_counter(), 0
        while len(returns) < episodes:
            stats = evaluate(envs, agent.algo, agent.algo.networks.normalizer, loaded.device,
                             seed=options["seed"] + round_ * num_envs, obs_dtype=agent.obs_dtype,
                             carry_size=agent.carry_size, deterministic=options["deterministic"],
                             frames=sink if round_ == 0 else None, masks=masks)
            if sink is not None and round_ == 0:
                recordings = sink.finish(stats.returns, stats.lengths)
            returns += stats.returns.tolist()
            lengths += stats.lengths.tolist()
            round_ += 1
    finally:
        if sink is not None:
            sink.close()
        envs.close()
    result = Result(loaded.path.parent.parent, loaded.path, loaded.env_factory.spec.id, returns[:episodes],
                    lengths[:episodes], time.perf_counter() - start)
    return result, recordings


def export_policy(loaded: Loaded, fmt: str, name: str, seed: int) -> tuple[Path, float, float, float]:
    """Write the standalone policy, then check it as its user would run it: its actions against rlcli's on
    1,000 observations from the env, and one episode's return against rlcli's on the same seed."""
    from omegaconf import OmegaConf

    from rlcli import policy_export as export
    from rlcli.registry import ConfigError

    agent = loaded.agent
    if agent.spec.action_masks:
        raise ConfigError(f"export: algo={loaded.cfg.algo.name} acts on the env's action masks, which an exported "
                          "policy (observation in, action out) has no input for yet; evaluate it with rl-eval instead")
    if loaded.cfg.actor.name == "combined":
        raise ConfigError("export: Dict observations with images (actor=combined) have no exported input format yet; "
                          "evaluate with rl-eval, or load the policy in Python: rlcli.load(run).predict(obs)")
    policy = export.StandalonePolicy(agent.algo, agent.obs_dtype, agent.carry_size).cpu()  # exports run on the CPU
    ours = export.numpy_policy(policy)
    dtype = export.input_dtype(policy)
    envs = loaded.env_factory.make(10, "sync", eval=True)
    try:
        observations = _observations(envs, ours, agent.carry_size, seed, steps=100, dtype=dtype)
        path = loaded.path.parent.parent / "export" / f"{name}{export.FORMATS[fmt]}"
        export.export(policy, fmt, path, observations[0])
        exported = export.run_exported(path, fmt)
        difference = export.max_difference(ours, exported, observations, agent.carry_size)
        their_return = _episode_return(envs, exported, agent.carry_size, seed, dtype)
        our_return = _episode_return(envs, ours, agent.carry_size, seed, dtype)
    finally:
        envs.close()
    export.write_metadata(path, export.metadata(policy, fmt, loaded.env_factory.spec.id,
                                                envs.single_observation_space, envs.single_action_space, loaded.path,
                                                OmegaConf.to_container(loaded.cfg.env, resolve=True)))
    return path, difference, their_return, our_return


def _observations(envs: Any, act: Any, carry_size: int, seed: int, steps: int, dtype: Any) -> Any:
    """[steps, envs, ...] observations met by the policy (episodes restart as they end)."""
    import numpy as np

    obs, _ = envs.reset(seed=seed)
    carry = np.zeros((envs.num_envs, carry_size), dtype=np.float32) if carry_size else None
    seen = []
    for _ in range(steps):
        obs = obs.astype(dtype)  # what the exported file takes
        seen.append(obs)
        out = act(obs, carry)
        action, carry = out if carry_size else (out, None)
        obs, *_ = envs.step(action)
    return np.stack(seen)


def _episode_return(envs: Any, act: Any, carry_size: int, seed: int, dtype: Any) -> float:
    """The return of the first env's first episode from `seed` (what rl-eval's episode 0 is)."""
    import numpy as np

    obs, _ = envs.reset(seed=seed)
    carry = np.zeros((envs.num_envs, carry_size), dtype=np.float32) if carry_size else None
    while True:
        out = act(obs.astype(dtype), carry)
        action, carry = out if carry_size else (out, None)
        obs, _, _, _, infos = envs.step(action)
        if "_episode" in infos and infos["_episode"][0]:
            return float(infos["episode"]["r"][0])


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
            check_one_env(target, runs)
            jobs = [checkpoint_of(r, str(options["load"])) for r in runs]
        else:
            raise ConfigError(f"{target}: no such run directory, checkpoint file or sweep directory")
        name = (lambda path: path.stem) if target.is_file() else (lambda path: str(options["load"]))
        if options["export"] is not None:
            exports = [export_policy(load_agent(path, options, env_overrides), options["export"], name(path),
                                     options["seed"]) for path in jobs]
        else:
            results, videos = [], []
            for path in jobs:
                result, recordings = evaluate_checkpoint(load_agent(path, options, env_overrides), options, name(path))
                results.append(result)
                videos += recordings
    except (ConfigError, checkpoint.CheckpointError) as error:
        _fail(str(error))
    except OSError as error:  # export/ or videos/ in a read-only or vanished run directory, a full disk
        _fail(describe_os_error(error), code=1)
    if options["export"] is not None:
        report_exports(exports)
        return
    results.sort(key=lambda r: -sum(r.returns) / len(r.returns))
    shown = {k: v for k, v in options.items() if k != "device"}
    mode = "deterministic" if options["deterministic"] else "stochastic"
    print_table(results, f"rl-eval: {options['episodes']} {mode} episodes each, seed {options['seed']}")
    for v in videos:
        print(f"video: {v.path} ({v.frames} frames, return {v.episode_return:g}, {v.length} steps)")
    try:
        for r in results:
            out = r.run_dir / "eval"
            out.mkdir(exist_ok=True)
            (out / f"{name(r.checkpoint)}.json").write_text(
                json.dumps(r.record(shown | {"env_overrides": env_overrides}), indent=1))
    except OSError as error:  # the table above holds the results; only their record could not be kept
        _fail(describe_os_error(error), code=1)



def report_exports(exports: list[tuple[Path, float, float, float]]) -> None:
    """One line per exported file with its check; exit code 1 when the file does not act as rlcli does."""
    failed = False
    for path, difference, their_return, our_return in exports:
        # continuous actions differ by float rounding (~1e-7), which a long episode adds up: same to 1e-4
        same = difference <= 1e-5 and abs(their_return - our_return) <= 1e-4 * max(1.0, abs(our_return))
        failed |= not same
        print(f"exported {path} ({path.stat().st_size / 1024:.1f} kB, inputs and outputs in {path.stem}.json): "
              f"actions differ from rlcli's by at most {difference:.2g} on 1,000 observations; episode from the "
              f"seed: return {their_return:g} (rlcli: {our_return:g})" + ("" if same else "  MISMATCH"))
    if failed:
        print("rl-eval: error: an exported policy does not act as rlcli's does (see MISMATCH above)", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
