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
which says that you trust whoever wrote the file. Nor does it import a module that it names: an env id
of the `module:Env-v0` form in the checkpoint's config is built only when you name it again
(env.id=module:Env-v0) or pass trusted_checkpoint=true.

Bad input is one line and exit code 2, with nothing written. An env that raises or returns non-finite
values is one line naming the env, the step and the episode, exit code 1, nothing written; a record
that cannot be written is one line after the table, exit code 1.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from rlcli.entry.checked_envs import CheckedEnvs, EnvFailed
from rlcli.entry.run_loading import Loaded, check_one_env, checkpoint_of, is_run_dir, load_agent
from rlcli.run.stop import raise_lost_signal
from rlcli.services.os_errors import describe_os_error

USAGE = __doc__.split("\n\n")[1]
# the files this invocation has written (eval records, exports, videos): what rl-eval's line names when a signal
# stops it
written: list[Path] = []
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
    # env=pz: each agent's return per episode; `returns` are their sums over the group (never divided)
    agent_returns: dict[str, list[float]] | None = None
    team_returns: list[float] | None = None  # env=pz: over every agent of the env, those outside env.agents too
    group_returns: dict[str, list[float]] | None = None  # env.groups: each group's sum of its agents' returns

    def record(self, options: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        r = np.asarray(self.returns)
        agents = {} if self.agent_returns is None else {
            "agent_returns": self.agent_returns,
            "agent_means": {name: float(np.mean(a)) for name, a in self.agent_returns.items()},
            "team_returns": self.team_returns, "team_mean": float(np.mean(self.team_returns or [np.nan])),
            **({} if not self.group_returns else {
                "group_returns": self.group_returns,
                "group_means": {group: float(np.mean(g)) for group, g in self.group_returns.items()}})}
        return {"checkpoint": str(self.checkpoint), "env": self.env_id, **options, "episodes": len(r),
                "mean": float(r.mean()), "std": float(r.std()), "min": float(r.min()), "max": float(r.max()),
                "mean_length": float(np.mean(self.lengths)), "wall_s": round(self.seconds, 3),
                "returns": self.returns, "lengths": self.lengths, **agents}


def _fail(message: str, code: int = 2) -> NoReturn:
    print(f"rl-eval: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def parse(argv: list[str]) -> tuple[Path, dict[str, Any], list[str]]:
    """(target, options, env overrides) from the command line; a one-line ConfigError when it does not parse."""
    from rlcli.registry import ConfigError, did_you_mean
    from rlcli.run.compose import as_key_value

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
    from rlcli.services import policy_export as export
    from rlcli.services import video

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


def evaluate_checkpoint(loaded: Loaded, options: dict[str, Any], name: str) -> tuple[Result, list[Any]]:
    """Run `episodes` episodes (episode i from seed `seed + i`); with video=true the first round of envs
    renders, and the first `video_episodes` of its episodes are written to <run dir>/videos/."""
    from rlcli.collectors.testing import evaluate
    from rlcli.envs.multiagent import find_attr, group_returns
    from rlcli.services import video

    agent, episodes = loaded.agent, options["episodes"]
    num_envs = min(options["num_envs"] or min(episodes, 16), episodes)
    mode = loaded.cfg.train.get("vector_mode", "auto")
    masks = agent.spec.action_masks
    envs = CheckedEnvs(loaded.env_factory.make(num_envs, mode, eval=True, render=options["video"], masks=masks),
                       loaded.env_factory.spec.id)
    sink = None
    if options["video"]:
        video.check_draws(envs, "video=true")
        sink = video.VideoSink(loaded.path.parent.parent / "videos", name, options["video_format"],
                               video.frames_per_second(envs), options["video_episodes"], options["video_concat"])
    recordings: list[Any] = []
    try:
        returns: list[float] = []
        lengths: list[int] = []
        agents: dict[str, list[float]] = {}
        team: list[float] = []
        start, round_ = time.perf_counter(), 0
        while len(returns) < episodes:
            envs.first_episode = round_ * num_envs  # what its one-line failure names
            stats = evaluate(envs, agent.algo, agent.algo.networks.normalizer, loaded.device,
                             seed=options["seed"] + round_ * num_envs, obs_dtype=agent.obs_dtype,
                             carry_size=agent.carry_size, deterministic=options["deterministic"],
                             frames=sink if round_ == 0 else None, masks=masks)
            if sink is not None and round_ == 0:
                recordings = sink.finish(stats.returns, stats.lengths)
            returns += stats.returns.tolist()
            lengths += stats.lengths.tolist()
            for agent_name, agent_returns in (stats.agent_returns or {}).items():
                agents.setdefault(agent_name, []).extend(agent_returns.tolist())
            team += [] if stats.team_returns is None else stats.team_returns.tolist()
            round_ += 1
    finally:
        if sink is not None:
            sink.close()
        envs.close()
    result = Result(loaded.path.parent.parent, loaded.path, loaded.env_factory.spec.id, returns[:episodes],
                    lengths[:episodes], time.perf_counter() - start,
                    {name: a[:episodes] for name, a in agents.items()} or None, team[:episodes] or None)
    groups = find_attr(envs, "agent_groups") or {}
    if result.agent_returns and len(groups) > 1:
        result.group_returns = {group: r.tolist() for group, r in group_returns(result.agent_returns, groups).items()}
    return result, recordings


def print_table(results: list[Result], title: str) -> None:
    import numpy as np
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from rlcli.services.log import fmt_return

    table = Table(title=title, header_style="bold cyan")
    for column in ("run", "env", "episodes", "return (mean ± std)", "min", "max", "mean length", "wall s"):
        table.add_column(column, justify="left" if column in ("run", "env") else "right", overflow="fold")
    for r in results:
        a = np.asarray(r.returns)
        table.add_row(escape(str(r.run_dir)), escape(r.env_id), str(len(a)),
                      f"{fmt_return(float(a.mean()))} ± {a.std():.1f}", fmt_return(float(a.min())),
                      fmt_return(float(a.max())), f"{np.mean(r.lengths):.0f}", f"{r.seconds:.1f}")
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    console.print(table)
    for r in results:  # env=pz: the return above is the team sum over the group's agents; each agent's mean
        if r.agent_returns:
            means = ", ".join(f"{name} {fmt_return(float(np.mean(a)))}" for name, a in r.agent_returns.items())
            console.print(f"{r.run_dir}: per agent (mean return; the table's return is their sum): {means}",
                          highlight=False, soft_wrap=True)
        if r.group_returns:
            means = ", ".join(f"{group} {fmt_return(float(np.mean(g)))}" for group, g in r.group_returns.items())
            console.print(f"{r.run_dir}: per group (mean of the sum of its agents' returns): {means}",
                          highlight=False, soft_wrap=True)
        if r.team_returns and r.team_returns != r.returns:
            console.print(f"{r.run_dir}: team return over every agent of the env, those outside env.agents too: "
                          f"{fmt_return(float(np.mean(r.team_returns)))}", highlight=False, soft_wrap=True)


def main(argv: list[str] | None = None) -> None:
    """Console entry point of `rl-eval`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    written.clear()
    if not argv or any(a in ("-h", "--help") for a in argv):
        print(f"usage: {USAGE.strip()}\n\n{__doc__.split(chr(10) * 2, 2)[2]}")
        return
    from rlcli.registry import ConfigError
    from rlcli.services import checkpoint

    try:
        target, options, env_overrides = parse(argv)
        if target.is_file():
            jobs = [target]
        elif is_run_dir(target):
            jobs = [checkpoint_of(target, str(options["load"]), warn=_warn)]
        elif target.is_dir():
            runs = sorted({p.parent.parent for p in target.rglob(".hydra/overrides.yaml")})
            runs = [r for r in runs if (r / "checkpoints").is_dir()]
            if not runs:
                raise ConfigError(f"{target} holds no run with checkpoints")
            check_one_env(target, runs)
            jobs = [checkpoint_of(r, str(options["load"]), warn=_warn) for r in runs]
        else:
            raise ConfigError(f"{target}: no such run directory, checkpoint file or sweep directory")
        name = (lambda path: path.stem) if target.is_file() else (lambda path: str(options["load"]))
        if options["export"] is not None:
            from rlcli.entry.export_check import export_policy

            exports = []
            for path in jobs:
                raise_lost_signal()
                exports.append(export_policy(load_agent(path, options, env_overrides), options["export"], name(path),
                                             options["seed"]))
                written.append(exports[-1][0])
        else:
            results, videos = [], []
            for path in jobs:
                raise_lost_signal()
                result, recordings = evaluate_checkpoint(load_agent(path, options, env_overrides), options, name(path))
                results.append(result)
                videos += recordings
                written.extend(v.path for v in recordings)
        raise_lost_signal()  # a signal whose interrupt Python lost (run/stop.py) stops rl-eval here, before writing
    except (ConfigError, checkpoint.CheckpointError) as error:
        _fail(str(error))
    except EnvFailed as error:  # the env raised or returned non-finite values: a failed evaluation, not bad input
        _fail(str(error), code=1)
    except OSError as error:  # export/ or videos/ in a read-only or vanished run directory, a full disk
        _fail(describe_os_error(error), code=1)
    if options["export"] is not None:
        report_exports(exports, options["seed"])
        return
    results.sort(key=lambda r: -sum(r.returns) / len(r.returns))
    shown = {k: v for k, v in options.items() if k != "device"}
    mode = "deterministic" if options["deterministic"] else "stochastic"
    print_table(results, f"rl-eval: {options['episodes']} {mode} episodes each, seed {options['seed']}")
    for v in videos:
        print(f"video: {v.path} ({v.frames} frames, return {v.episode_return:g}, {v.length} steps)")
    unwritten = []
    for r in results:
        record = r.run_dir / "eval" / f"{name(r.checkpoint)}.json"
        try:
            record.parent.mkdir(exist_ok=True)
            record.write_text(json.dumps(r.record(shown | {"env_overrides": env_overrides}), indent=1))
            written.append(record)
        except OSError as error:  # a read-only or vanished run directory, a full disk: the other runs' are still kept
            unwritten.append(describe_os_error(error, fallback_path=record))
    if unwritten:
        # exit code 1: the table above holds the results, but the record rl-eval promises (and scripts read) is missing
        more = f" (and {len(unwritten) - 1} more)" if len(unwritten) > 1 else ""
        _fail(f"the results above were not recorded: {unwritten[0]}{more}", code=1)


def _warn(message: str) -> None:
    print(f"rl-eval: warning: {message}", file=sys.stderr)


def report_exports(exports: list[tuple[Path, float, float, float]], seed: int) -> None:
    """One line per exported file with its check; exit code 1 when the file does not act as rlcli does."""
    failed = False
    for path, difference, their_return, our_return in exports:
        # continuous actions differ by float rounding (~1e-7), which a long episode adds up: same to 1e-4
        same = difference <= 1e-5 and abs(their_return - our_return) <= 1e-4 * max(1.0, abs(our_return))
        failed |= not same
        print(f"exported {path} ({path.stat().st_size / 1024:.1f} kB, inputs and outputs in {path.stem}.json): "
              f"actions differ from rlcli's by at most {difference:.2g} on 1,000 observations; episode 0 of "
              f"rl-eval <run> (seed {seed}): return {their_return:g} with the file, {our_return:g} with rlcli"
              + ("" if same else "  MISMATCH"))
    if failed:
        print("rl-eval: error: an exported policy does not act as rlcli's does (see MISMATCH above)", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
