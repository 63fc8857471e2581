"""`rl-report`: one table (and optionally curves and a CSV) for a sweep or any set of runs.

A run is a directory with `.hydra/` (what it was asked to do) and `eval.jsonl` (every test phase:
env steps, wall seconds, episode returns), both written by rl-train. Runs whose command lines
differ only by `seed=` form one configuration; the table gives, per configuration, the final and
best test return as mean +- std over seeds and the interquartile mean (IQM) of the final returns. Offline runs on
a dataset with reference returns also record each test phase's D4RL normalized score: the table then gives the
final and best score as mean +- a 95% confidence interval over seeds (as CORL's tables do).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from rlcli.services import jsonl
from rlcli.services.os_errors import describe_os_error
from rlcli.sweeps.tuning import iqm

IGNORED_KEYS = ("seed", "resume", "sweep.trial", "hydra.sweep.dir", "hydra.run.dir")


@dataclass
class Run:
    path: Path
    config: dict[str, str]  # what identifies its configuration: algo, env and every override but the seed
    seed: Any
    steps: list[int] = field(default_factory=list)  # test phases: env steps
    returns: list[float] = field(default_factory=list)  # and mean test return
    scores: list[float] = field(default_factory=list)  # and normalized score (offline runs with reference returns)
    env_steps: int | None = None
    wall_s: float | None = None
    status: str = "unknown"
    # multi-agent runs (env=pz): the last test phase's mean return of each agent, and of the whole team (with the
    # agents outside env.agents); `returns` are the sums over the group's agents, never divided
    agent_finals: dict[str, float] = field(default_factory=dict)
    group_finals: dict[str, float] = field(default_factory=dict)  # env.groups: each group's final return
    team_final: float | None = None

    @property
    def final(self) -> float | None:
        return self.returns[-1] if self.returns else None

    @property
    def best(self) -> float | None:
        return max(self.returns) if self.returns else None

    @property
    def final_score(self) -> float | None:
        return self.scores[-1] if self.scores else None

    @property
    def best_score(self) -> float | None:
        return max(self.scores) if self.scores else None


def _yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None


def _mapping(value: Any, *keys: str) -> dict[str, Any]:
    """`value[keys[0]][keys[1]]...` when each level is a mapping, else {}: a run's files may hold anything (a list
    where a mapping belongs, a scalar), and a report reads them, never trusts their shape."""
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, dict) else {}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _returns(value: Any) -> bool:
    """A non-empty list of numbers (a record's per-agent or team returns)."""
    return isinstance(value, list) and bool(value) and all(_number(v) for v in value)


def load_run(path: Path) -> Run:
    overrides = _yaml(path / ".hydra" / "overrides.yaml")
    overrides = overrides if isinstance(overrides, list) else []
    choices = _mapping(_yaml(path / ".hydra" / "hydra.yaml"), "hydra", "runtime", "choices")
    job_cfg = _mapping(_yaml(path / ".hydra" / "config.yaml"))
    config = {group: str(choices[group]) for group in ("algo", "env") if group in choices}
    for arg in overrides:
        key, _, value = str(arg).partition("=")
        key = key.lstrip("+~")
        if not key.startswith(IGNORED_KEYS):  # a sweep's job records compile=True for the compile=true typed
            config[key] = value.lower() if value in ("True", "False") else value
    run = Run(path=path, config=config, seed=job_cfg.get("seed"))
    eval_path = path / "eval.jsonl"
    for record in jsonl.read_records(eval_path, warn=lambda text: print(f"rl-report: warning: {text}",
                                                                         file=sys.stderr)):
        try:
            steps, mean = int(record["env_steps"]), float(np.mean(record["returns"]))
            wall_s = float(record.get("wall_s", 0.0))
        except (KeyError, TypeError, ValueError, AttributeError):
            continue  # a record that is whole but not a test phase's
        run.steps.append(steps)
        run.returns.append(mean)
        agents, team = record.get("agent_returns"), record.get("team_returns")
        run.agent_finals = ({str(name): float(np.mean(r)) for name, r in agents.items() if _returns(r)}
                            if isinstance(agents, dict) else {})
        run.team_final = float(np.mean(team)) if _returns(team) else None
        groups = record.get("group_returns")
        run.group_finals = ({str(name): float(np.mean(r)) for name, r in groups.items() if _returns(r)}
                            if isinstance(groups, dict) else {})
        score = record.get("normalized_score")
        if _number(score):
            run.scores.append(float(score))
        run.wall_s = wall_s
        run.env_steps = steps
    status = None
    with contextlib.suppress(OSError, ValueError):
        status = json.loads((path / "status.json").read_text())
    if isinstance(status, dict) and status:  # only the values of the kinds rl-train writes are taken
        run.status = str(status.get("status", "unknown"))
        if _number(status.get("env_steps")):
            run.env_steps = int(status["env_steps"])
        if _number(status.get("train_seconds")):
            run.wall_s = float(status["train_seconds"])
    elif run.returns:
        run.status = "has tests"
    return run


def find_runs(paths: list[Path]) -> list[Run]:
    """Every run directory at or under the given paths (a sweep dir, a runs/ tree, run dirs)."""
    found: dict[Path, None] = {}
    for root in paths:
        if (root / ".hydra" / "overrides.yaml").is_file():
            found[root.resolve()] = None
        for marker in sorted(root.rglob(".hydra/overrides.yaml")):
            found[marker.parent.parent.resolve()] = None
    return [load_run(path) for path in found]


@dataclass
class Group:
    config: dict[str, str]
    runs: list[Run]

    def values(self, attr: str) -> list[float]:
        return [v for v in (getattr(r, attr) for r in self.runs) if v is not None and math.isfinite(v)]


def group_runs(runs: list[Run]) -> list[Group]:
    groups: dict[tuple, Group] = {}
    for run in runs:
        key = tuple(sorted(run.config.items()))
        groups.setdefault(key, Group(dict(run.config), [])).runs.append(run)
    return list(groups.values())


def repeated_seeds(groups: list[Group], keys: list[str]) -> list[str]:
    """A seed that stands in two runs of one configuration (the same sweep run twice, a population and its basic
    twin): each is counted as a run, but their returns are not independent draws, so the mean ± std over-claim."""
    warnings = []
    for group in groups:
        by_seed: dict[str, list[Path]] = {}
        for run in group.runs:
            by_seed.setdefault(str(run.seed), []).append(run.path)
        for seed, paths in by_seed.items():
            if len(paths) > 1:
                config = " ".join(f"{k}={group.config.get(k, '-')}" for k in keys)
                warnings.append(f"{config}: seed {seed} stands in {len(paths)} runs ({', '.join(map(str, paths[:3]))}"
                                f"{' ...' if len(paths) > 3 else ''}); each counts as a seed, so its spread is not "
                                "over independent seeds (report one of them)")
    return warnings


def swept_keys(groups: list[Group]) -> list[str]:
    """Keys whose value differs between configurations (those are the table's first columns)."""
    keys: list[str] = []
    for group in groups:
        for key in group.config:
            if key not in keys:
                keys.append(key)
    varying = [k for k in keys if len({g.config.get(k) for g in groups}) > 1]
    return varying or [k for k in ("algo", "env") if k in keys]


def _mean_std(values: list[float]) -> tuple[float, float] | None:
    if not values:
        return None
    return float(np.mean(values)), float(np.std(values))


# Student's t 97.5% quantiles for 1..30 degrees of freedom: with 3 seeds a 95% interval is 4.30 standard errors, not
# the normal approximation's 1.96 (which would claim twice the certainty the seeds give)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def ci_half_width(values: Any) -> float:
    """Half-width of the 95% confidence interval of the mean of `values` (Student's t; 0 for one value)."""
    n = len(values)
    if n < 2:
        return 0.0
    t = _T975[n - 2] if n - 1 <= len(_T975) else 1.96
    return t * float(np.std(values, ddof=1)) / math.sqrt(n)


def _mean_ci(values: list[float]) -> tuple[float, float] | None:
    """Mean and the half-width of its 95% confidence interval over seeds (Student's t), as the curves' bands."""
    if not values:
        return None
    return float(np.mean(values)), ci_half_width(values)


def summarize(group: Group) -> dict[str, Any]:
    """The numbers of one table row (None where no run had them)."""
    finals, bests = group.values("final"), group.values("best")
    scores = {"final_score": _mean_ci(group.values("final_score")), "best_score": _mean_ci(group.values("best_score"))}
    steps, wall = group.values("env_steps"), group.values("wall_s")
    names = list(dict.fromkeys(name for r in group.runs for name in r.agent_finals))
    group_names = list(dict.fromkeys(name for r in group.runs for name in r.group_finals))
    teams = [r for r in group.runs if r.team_final is not None and r.final is not None]
    return {
        "seeds": sorted((r.seed for r in group.runs), key=str),
        "final": _mean_std(finals), "final_iqm": iqm(finals) if finals else None,
        "best": _mean_std(bests),
        "env_steps": float(np.mean(steps)) if steps else None,
        "wall_s": float(np.mean(wall)) if wall else None,
        "incomplete": sum(r.status not in ("completed", "has tests") for r in group.runs),
        **scores,
        # env=pz: each agent's final return (mean over seeds); the team's over every agent of the env, where agents
        # outside env.agents make it differ from `final` (the group's sum)
        "agents": {name: float(np.mean([r.agent_finals[name] for r in group.runs if name in r.agent_finals]))
                   for name in names},
        "team": _mean_std([r.team_final for r in teams if r.team_final is not None])
        if any(r.team_final != r.final for r in teams) else None,
        # env.groups: each group's final return (the sum of its agents'), mean over seeds
        "groups": {name: float(np.mean([r.group_finals[name] for r in group.runs if name in r.group_finals]))
                   for name in group_names},
    }


def _pm(pair: tuple[float, float] | None, n: int) -> str:
    """mean ± std; with one seed there is no spread to show."""
    if pair is None:
        return "-"
    return f"{pair[0]:.1f} ± {pair[1]:.1f}" if n > 1 else f"{pair[0]:.1f} ± -"


def _agents(finals: dict[str, float], sep: str = " ") -> str:
    """Each agent's final return: `agent_0 10.0, agent_1 9.5` (the CSV's: `agent_0=10.0 agent_1=9.5`)."""
    if sep == "=":
        return " ".join(f"{name}={value:g}" for name, value in finals.items())
    return ", ".join(f"{name} {value:.1f}" for name, value in finals.items())


def _ci(pair: tuple[float, float] | None, n: int) -> str:
    """mean ± 95% CI half-width; with one seed there is no interval to show."""
    if pair is None:
        return "-"
    return f"{pair[0]:.1f} ± {pair[1]:.1f}" if n > 1 else f"{pair[0]:.1f} ± -"


def print_table(groups: list[Group], keys: list[str]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(header_style="bold cyan")
    for key in keys:
        table.add_column(escape(key), overflow="fold")
    scored = any(r.scores for g in groups for r in g.runs)
    rows = [summarize(group) for group in groups]
    agents, team = any(row["agents"] for row in rows), any(row["team"] for row in rows)
    groups_seen = any(row["groups"] for row in rows)
    columns = ("seeds", "final return", "final IQM", "best return", *(("final score", "best score") if scored else ()),
               *(("final per agent",) if agents else ()), *(("final per group",) if groups_seen else ()),
               *(("final team (all agents)",) if team else ()),
               "gradient steps" if all("dataset" in g.config for g in groups) else "env steps", "wall s")
    for column in columns:
        table.add_column(column, justify="right")
    for group, row in zip(groups, rows, strict=True):
        seeds = f"{len(row['seeds'])}: {','.join(map(str, row['seeds']))}"  # how many, and which
        if row["incomplete"]:
            seeds += f" ({row['incomplete']} unfinished)"
        n = len(group.values("final"))
        table.add_row(*(escape(str(group.config.get(k, "-"))) for k in keys), seeds, _pm(row["final"], n),
                      "-" if row["final_iqm"] is None else f"{row['final_iqm']:.1f}", _pm(row["best"], n),
                      *((_ci(row["final_score"], n), _ci(row["best_score"], n)) if scored else ()),
                      *((_agents(row["agents"]) or "-",) if agents else ()),
                      *((_agents(row["groups"]) or "-",) if groups_seen else ()),
                      *((_pm(row["team"], n),) if team else ()),
                      "-" if row["env_steps"] is None else f"{row['env_steps']:,.0f}",
                      "-" if row["wall_s"] is None else f"{row['wall_s']:.1f}")
    console = Console()
    if not console.is_terminal:  # piped or captured: wide enough that keys and numbers stay whole
        console = Console(width=200)
    console.print(table)


def write_csv(groups: list[Group], keys: list[str], path: Path) -> None:
    columns = [*keys, "n_seeds", "seeds", "final_mean", "final_std", "final_iqm", "best_mean", "best_std",
               "env_steps_mean", "wall_s_mean", "final_score_mean", "final_score_ci95", "best_score_mean",
               "best_score_ci95", "final_per_agent", "final_team_mean", "final_team_std", "final_per_group"]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for group in groups:
            row = summarize(group)
            single = len(row["seeds"]) < 2  # one seed has no spread: empty, as the table's "± -"
            final, best, team = (((pair[0], None) if single else pair) if pair else (None, None)
                                 for pair in (row["final"], row["best"], row["team"]))
            writer.writerow([*(group.config.get(k, "") for k in keys), len(row["seeds"]),
                             " ".join(map(str, row["seeds"])), *final, row["final_iqm"], *best,
                             row["env_steps"], row["wall_s"], *(row["final_score"] or (None, None)),
                             *(row["best_score"] or (None, None)), _agents(row["agents"], "="),
                             *team, _agents(row["groups"], "=")])


def mean_curve(runs: list[Run]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and 95% confidence band (Student's t over the seeds) across seeds,
    on the union of the seeds' test steps; a seed counts only within the steps it reached."""
    grid = np.array(sorted({s for r in runs for s in r.steps}), dtype=float)
    mean, half = np.zeros_like(grid), np.zeros_like(grid)
    for i, step in enumerate(grid):
        values = [float(np.interp(step, r.steps, r.returns)) for r in runs
                  if r.steps and r.steps[0] <= step <= r.steps[-1]]
        mean[i] = np.mean(values)
        half[i] = ci_half_width(values)
    return grid, mean, half


def plot_curves(groups: list[Group], keys: list[str], path: Path) -> list[str]:
    """Write the curves to `path`; returns each drawn line's marker (points are marked when a curve has few
    of them, so a run with one test still shows up)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    markers = []
    for group in groups:
        runs = [r for r in group.runs if r.steps]
        if not runs:
            continue
        grid, mean, half = mean_curve(runs)
        label = " ".join(f"{k}={group.config.get(k, '-')}" for k in keys) + f" (n={len(runs)})"
        (line,) = ax.plot(grid, mean, label=label, marker="o" if len(grid) <= 30 else "", markersize=4)
        markers.append(line.get_marker())
        ax.fill_between(grid, mean - half, mean + half, color=line.get_color(), alpha=0.2)
    ax.set_xlabel("env steps")
    ax.set_ylabel("test return (mean, 95% CI over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return markers


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="rl-report", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="a multirun directory, a runs/ tree, or run directories")
    parser.add_argument("--plot", type=Path, metavar="PNG", help="write learning curves (mean and 95%% CI per config)")
    parser.add_argument("--csv", type=Path, metavar="CSV", help="write the table as CSV")
    # listed for --help; the console script (entry/cli.py: report) answers it before this parser runs
    parser.add_argument("--version", "-V", action="store_true", help="print rlcli's version and exit")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.paths if not p.exists()]
    if missing:
        print(f"rl-report: error: no such directory: {', '.join(missing)}", file=sys.stderr)
        raise SystemExit(2)
    runs = find_runs(args.paths)
    if not runs:
        print(f"rl-report: error: no runs under {' '.join(map(str, args.paths))} "
              "(a run is a directory with .hydra/overrides.yaml, as rl-train writes)", file=sys.stderr)
        raise SystemExit(2)
    if args.plot:  # before anything is written: a missing extra is one line, as everywhere else
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("rl-report: error: --plot needs matplotlib: pip install -e '.[sweep]' (or pip install matplotlib)",
                  file=sys.stderr)
            raise SystemExit(2) from None
    for out in (args.csv, args.plot):
        if out is not None and not out.parent.resolve().is_dir():
            print(f"rl-report: error: cannot write {out}: the directory {out.parent} does not exist", file=sys.stderr)
            raise SystemExit(2)
    groups = group_runs(runs)
    keys = swept_keys(groups)
    for warning in repeated_seeds(groups, keys):
        print(f"rl-report: warning: {warning}", file=sys.stderr)
    print_table(groups, keys)
    try:
        if args.csv:
            write_csv(groups, keys, args.csv)
            print(f"wrote {args.csv}", file=sys.stderr)
        if args.plot:
            plot_curves(groups, keys, args.plot)
            print(f"wrote {args.plot}", file=sys.stderr)
    except OSError as error:
        print(f"rl-report: error: {describe_os_error(error, args.csv or args.plot)}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
