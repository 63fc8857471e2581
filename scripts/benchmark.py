"""Results matrix: algo x env x seeds through rl-train sweeps, next to RL-Zoo's published returns.

    python scripts/benchmark.py --rows ppo:CartPole-v1 dqn:CartPole-v1 --seeds 1 2 3
    python scripts/benchmark.py --matrix cpu                 # every row that fits a 2-core CPU (MATRICES)
    python scripts/benchmark.py --matrix gpu --dry-run       # print the commands only

A row is `algo:env` (the shipped tuned config and its budget) or `algo:env:steps`. Each row is one
`rl-train -m` sweep over the seeds in <out>/<algo>-<env>/, with a fixed budget (no early stop) and a
checkpoint every tenth of it; the same command again resumes a killed sweep (`resume=auto`: complete
seeds are skipped, interrupted ones continue from their last checkpoint). Then <out>/results.md: the
final test return mean ± std over seeds, its IQM, env steps, wall time, RL-Zoo's published mean ±
std and budget (benchmark/rl_zoo.csv), and whether the row falls below RL-Zoo's mean minus one std;
and <out>/curves-<env>.png, every row's learning curves on that env (rl-report's plot).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ZOO = ROOT / "benchmark" / "rl_zoo.csv"

MATRICES: dict[str, list[str]] = {
    # fits a 2-core CPU in a few hours: classic control at RL-Zoo's budgets, LunarLander, reduced MuJoCo
    "cpu": ["ppo:CartPole-v1", "a2c:CartPole-v1", "dqn:CartPole-v1", "qrdqn:CartPole-v1", "trpo:CartPole-v1",
            "pqn:CartPole-v1", "ppo:Acrobot-v1", "dqn:Acrobot-v1", "trpo:Acrobot-v1", "ppo:Pendulum-v1",
            "trpo:Pendulum-v1", "sac:Pendulum-v1", "td3:Pendulum-v1", "tqc:Pendulum-v1", "crossq:Pendulum-v1",
            "ppo:LunarLander-v3", "dqn:LunarLander-v3", "a2c:LunarLander-v3", "ppo:Hopper-v5:200000",
            "ppo:HalfCheetah-v5:200000", "sac:HalfCheetah-v5:50000", "td3:HalfCheetah-v5:50000"],
    # RL-Zoo's budgets for the off-policy MuJoCo rows: needs a GPU machine (run with device=cuda)
    "gpu": ["sac:HalfCheetah-v5", "sac:Hopper-v5", "td3:HalfCheetah-v5", "td3:Hopper-v5"],
}


def parse_row(text: str) -> tuple[str, str, int | None]:
    parts = text.split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise SystemExit(f"benchmark: row {text!r} is not algo:env or algo:env:steps")
    steps = int(parts[2]) if len(parts) == 3 else None
    return parts[0], parts[1], steps


def tuned_budget(algo: str, env: str) -> int:
    """The total_steps the shipped config gives this pair (what `rl-train algo=.. env=..` runs)."""
    from hydra import compose, initialize_config_dir

    from rlcli.run.compose import conf_dir

    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3", job_name="benchmark"):
        return int(compose("config", overrides=[f"algo={algo}", f"env={env}"]).train.total_steps)


def sweep_command(algo: str, env: str, steps: int, seeds: list[int], sweep_dir: Path, extra: list[str]) -> list[str]:
    rl_train = Path(sys.executable).parent / "rl-train"
    return [str(rl_train), "-m", f"algo={algo}", f"env={env}", f"seed={','.join(map(str, seeds))}",
            f"train.total_steps={steps}", "train.stop_reward=null", f"train.checkpoint_every={max(1, steps // 10)}",
            "log.console=false", f"hydra.sweep.dir={sweep_dir}", "resume=auto", *extra]


def load_zoo() -> dict[tuple[str, str], dict[str, str]]:
    with ZOO.open() as f:
        return {(r["algo"], r["env"]): r for r in csv.DictReader(f)}


def row_results(algo: str, env: str, steps: int, sweep_dir: Path, zoo: dict) -> dict[str, str]:
    import numpy as np

    from rlcli.entry.rl_report import find_runs
    from rlcli.sweeps.tuning import iqm

    runs = [r for r in find_runs([sweep_dir]) if r.final is not None]
    finals = [float(r.final) for r in runs]  # type: ignore[arg-type]
    out = {"row": f"{algo} {env}", "seeds": str(len(runs)), "budget": f"{steps:,}"}
    if finals:
        out["return"] = f"{np.mean(finals):.1f} ± {np.std(finals):.1f}"
        out["iqm"] = f"{iqm(finals):.1f}"
        out["env steps"] = f"{max(r.env_steps or 0 for r in runs):,}"
        walls = [r.wall_s for r in runs if r.wall_s]
        out["wall s"] = f"{np.median(walls):.1f} ({min(walls):.1f}-{max(walls):.1f})" if walls else "-"
    else:
        out.update({"return": "no finished run", "iqm": "-", "env steps": "-", "wall s": "-"})
    ref = zoo.get((algo, env))
    if ref is None:
        out["RL-Zoo"], out["vs RL-Zoo"] = "not published", "-"
    else:
        mean, std, budget = float(ref["mean_reward"]), float(ref["std_reward"]), int(ref["n_timesteps"])
        out["RL-Zoo"] = f"{mean:.1f} ± {std:.1f} at {budget:,}" + (
            f" ({ref['published_env']})" if ref["published_env"] != env else "")
        if not finals:
            out["vs RL-Zoo"] = "-"
        elif np.mean(finals) >= mean - std:
            out["vs RL-Zoo"] = "within" if steps >= budget else "within (reduced budget)"
        else:
            out["vs RL-Zoo"] = "BELOW" if steps >= budget else "below (reduced budget)"
    return out


COLUMNS = ["row", "seeds", "budget", "return", "iqm", "env steps", "wall s", "RL-Zoo", "vs RL-Zoo"]


def write_table(results: list[dict[str, str]], path: Path, seeds: list[int]) -> None:
    import gymnasium
    import torch

    lines = [f"Measured {datetime.date.today()} on {platform.node() or 'this machine'} ({platform.machine()}, "
             f"{_cpus()} CPUs), torch {torch.__version__}, gymnasium {gymnasium.__version__}, Python "
             f"{platform.python_version()}; seeds {', '.join(map(str, seeds))}. Return: the final test phase's "
             "mean return, mean ± std over seeds; IQM over seeds; wall s: training seconds per seed, median "
             "(min-max).", "", "| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    lines += ["| " + " | ".join(r[c] for c in COLUMNS) + " |" for r in results]
    path.write_text("\n".join(lines) + "\n")


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", default=[], help="algo:env or algo:env:steps")
    parser.add_argument("--matrix", choices=sorted(MATRICES), help="a predefined list of rows")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--out", type=Path, default=Path("benchmark/results"))
    parser.add_argument("--dry-run", action="store_true", help="print each row's command and stop")
    parser.add_argument("extra", nargs="*", help="more overrides for every run after --, e.g. -- device=cuda")
    args = parser.parse_args()
    rows = [parse_row(r) for r in [*(MATRICES[args.matrix] if args.matrix else []), *args.rows]]
    if not rows:
        raise SystemExit("benchmark: give --rows algo:env ... or --matrix " + "|".join(sorted(MATRICES)))
    zoo, results = load_zoo(), []
    for algo, env, steps in rows:
        budget = steps or tuned_budget(algo, env)
        sweep_dir = args.out / f"{algo}-{env.replace('/', '_')}"
        command = sweep_command(algo, env, budget, args.seeds, sweep_dir, args.extra)
        print(" ".join(command), flush=True)
        if args.dry_run:
            continue
        done = subprocess.run(command, check=False)
        if done.returncode != 0:
            print(f"benchmark: {algo} {env} exited {done.returncode}; its table row shows what finished",
                  file=sys.stderr)
        results.append(row_results(algo, env, budget, sweep_dir, zoo))
    if args.dry_run:
        return
    args.out.mkdir(parents=True, exist_ok=True)
    write_table(results, args.out / "results.md", args.seeds)
    for env in sorted({env for _, env, _ in rows}):
        dirs = [str(args.out / f"{a}-{e.replace('/', '_')}") for a, e, _ in rows if e == env]
        plot = args.out / f"curves-{env.replace('/', '_')}.png"
        subprocess.run([str(Path(sys.executable).parent / "rl-report"), *dirs, "--plot", str(plot)],
                       check=False, stdout=subprocess.DEVNULL)
    print((args.out / "results.md").read_text())


if __name__ == "__main__":
    main()
