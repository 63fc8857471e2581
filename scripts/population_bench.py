"""A sweep's seeds as one batched population against the other ways of running them, whole processes side by
side in one invocation (the target of `hydra/launcher=population`).

    python scripts/population_bench.py --seeds 8 --members 1 2 4 8 16 --out population.json
    python scripts/population_bench.py --seeds 8 --steps 20000 --no-basic --no-sb3   # the scaling rows only
    python scripts/population_bench.py --algo dqn --steps 50000 --members 8 --no-sb3  # DQN CartPole's members
    python scripts/population_bench.py --algo sac --steps 20000 --members 1 2 4 8 --no-basic  # SAC Pendulum's
    python scripts/population_bench.py --members 8 --parallel 8 --compiled --no-basic --no-sb3  # compile=true too
    python scripts/population_bench.py --algo sac --steps 20000 --members 8 --no-basic --no-sb3 --device cuda  # GPU
    python scripts/population_bench.py --members --parallel 8 --compiled --no-basic --no-sb3 --rounds 3  # x2 rows

Rows, each a fresh process timed from start to exit (imports, env and network building, tests, checkpoints):
- `one seed`: `rl-train` alone, the unit every other row is divided by (`one seed compiled`, with `--compiled`,
  the unit of the compiled rows);
- `population M`: `rl-train -m seed=0..M-1 hydra/launcher=population hydra.launcher.n_jobs=1` (per-member
  throughput = M x steps / s);
- `population M x2` (`--parallel M`): the same with `hydra.launcher.n_jobs=2`, two populations of M/2 in two
  processes;
- `population M compiled` (`--compiled`): each population row again with compile=true (the members' whole
  minibatch or gradient step as one compiled graph; the actor-critics' critics' and policy's steps one each);
- `basic 8`: the same sweep with Hydra's basic launcher (one job after another);
- `joblib 8 x2`: Hydra's joblib launcher with 2 jobs at a time;
- `sb3 8 x2`: Stable-Baselines3 (scripts/bench.py's row of the same algorithm, the same RL-Zoo settings) over
  the same seeds, two processes at a time.
Every row is PPO (or `--algo`'s algorithm) on CartPole-v1 (SAC, TQC, TD3, DDPG: Pendulum-v1) with RL-Zoo's
settings (conf/tuned/<algo>/<env>.yaml, gSDE and per-episode training included), no early stop, torch threads 1;
the final test returns of every member are listed, so a faster row that learns less shows.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RL_TRAIN = str(Path(sys.executable).parent / "rl-train")
COMMON = ["env=CartPole-v1", "train.stop_reward=null", "log.console=false", "log.tensorboard=false"]
# the `population M` rows: one process (n_jobs=auto would split it into one per core)
ONE_PROCESS = ["hydra/launcher=population", "hydra.launcher.n_jobs=1"]


def timed(cmd: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if out.returncode != 0:
        raise SystemExit(f"population_bench: {' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    return seconds


def final_returns(sweep_dir: Path) -> list[float]:
    returns = []
    for status in sorted(sweep_dir.glob("*/status.json"), key=lambda p: int(p.parent.name)):
        returns.append(float(json.loads(status.read_text())["final_test_return"]))
    return returns


def rlcli_sweep(work: Path, name: str, seeds: int, steps: int, launcher: list[str]) -> dict[str, Any]:
    sweep = work / unique(work, name)
    seconds = timed([RL_TRAIN, "-m", *COMMON, f"train.total_steps={steps}",
                     f"seed={','.join(str(s) for s in range(seeds))}", *launcher, f"hydra.sweep.dir={sweep}"], work)
    return {"row": name, "runs": seeds, "seconds": seconds, "returns": final_returns(sweep)}


def unique(work: Path, name: str) -> str:
    """A directory name not yet used under `work` (another round's run of the same row gets its own)."""
    return next(c for c in (name if i == 0 else f"{name} {i}" for i in itertools.count()) if not (work / c).exists())


def one_seed(work: Path, steps: int, compiled: bool = False) -> dict[str, Any]:
    run_dir = work / unique(work, "one compiled" if compiled else "one")
    seconds = timed([RL_TRAIN, *COMMON, f"train.total_steps={steps}", "seed=0", f"hydra.run.dir={run_dir}",
                     *(["compile=true"] if compiled else [])], work)
    last = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines() if line.strip()][-1]
    return {"row": "one seed compiled" if compiled else "one seed", "runs": 1, "seconds": seconds,
            "returns": [statistics.mean(last["returns"])]}


def sb3_pairs(algo: str, seeds: int, steps: int) -> dict[str, Any]:
    """SB3 over the same seeds, two worker processes at a time (scripts/bench.py --worker sb3)."""
    bench = str(Path(__file__).with_name("bench.py"))
    started = time.perf_counter()
    returns: list[float] = []
    for first in range(0, seeds, 2):
        procs = [subprocess.Popen([sys.executable, bench, "--worker", "sb3", "--row", algo, "--seed", str(seed),
                                   "--steps", str(steps), "--threads", "1"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
                 for seed in range(first, min(first + 2, seeds))]
        for proc in procs:
            out, err = proc.communicate()
            if proc.returncode != 0:
                raise SystemExit(f"population_bench: SB3 failed:\n{err[-3000:]}")
            returns.append(float(json.loads(out.strip().splitlines()[-1])["final_return"]))
    return {"row": f"sb3 {seeds} x2", "runs": seeds, "seconds": time.perf_counter() - started, "returns": returns}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8, help="seeds of the basic, joblib and SB3 rows")
    parser.add_argument("--members", type=int, nargs="*", default=[8], help="population sizes to time")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--parallel", type=int, nargs="*", default=[],
                        help="population sizes also timed with hydra.launcher.n_jobs=2 (two processes)")
    parser.add_argument("--compiled", action="store_true",
                        help="also time every population row with compile=true (the members' step compiled whole)")
    parser.add_argument("--no-one-compiled", action="store_true",
                        help="with --compiled, no compiled one-seed row: compiled rows are divided by the eager one")
    parser.add_argument("--no-eager", action="store_true",
                        help="with --compiled, no eager population rows (a lent GPU's minutes: one seed and the "
                             "compiled populations only)")
    parser.add_argument("--no-basic", action="store_true", help="skip the basic and joblib launcher rows")
    parser.add_argument("--no-sb3", action="store_true")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every row this many times, round after round (each row's ratio is to its own "
                             "round's one seed): whole processes on a shared machine vary by several percent")
    parser.add_argument("--out", type=Path, default=Path("population.json"))
    parser.add_argument("--keep", type=Path, default=None,
                        help="run in this directory and keep the runs (their train.log ends with the time account)")
    parser.add_argument("--device", default="cpu", help="every rlcli row's device= (cpu, cuda, cuda:N)")
    parser.add_argument("--algo", default="ppo",
                        choices=["ppo", "a2c", "pg", "pqn", "dqn", "qrdqn", "sac", "tqc", "td3", "ddpg"],
                        help="the algorithm of every row (SB3 has rows for ppo, dqn, qrdqn, sac and tqc)")
    args = parser.parse_args()
    if args.no_eager and not args.compiled:
        parser.error("--no-eager leaves only the compiled rows: add --compiled")
    if args.algo in ("a2c", "pg", "pqn", "td3", "ddpg") and not args.no_sb3:
        parser.error(f"scripts/bench.py has no SB3 row for {args.algo}: add --no-sb3")
    COMMON[:0] = [f"algo={args.algo}"]
    COMMON.append(f"device={args.device}")
    if args.algo in ("sac", "tqc", "td3", "ddpg"):
        COMMON[1] = "env=Pendulum-v1"
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) if args.keep is None else args.keep
        work.mkdir(parents=True, exist_ok=True)
        plan = [lambda: one_seed(work, args.steps)]
        if args.compiled:  # first, so that a cut-off run on a lent GPU has the compiled pair
            if not args.no_one_compiled:
                plan.append(lambda: one_seed(work, args.steps, compiled=True))
            plan += [lambda m=m: rlcli_sweep(work, f"population {m} compiled", m, args.steps,
                                             [*ONE_PROCESS, "compile=true"]) for m in args.members]
        if not (args.compiled and args.no_eager):
            plan += [lambda m=m: rlcli_sweep(work, f"population {m}", m, args.steps, ONE_PROCESS)
                     for m in args.members]
            plan += [lambda m=m: rlcli_sweep(work, f"population {m} x2", m, args.steps,
                                             ["hydra/launcher=population", "hydra.launcher.n_jobs=2"])
                     for m in args.parallel]
        if args.compiled:
            plan += [lambda m=m: rlcli_sweep(work, f"population {m} x2 compiled", m, args.steps,
                                             ["hydra/launcher=population", "hydra.launcher.n_jobs=2", "compile=true"])
                     for m in args.parallel]
        if not args.no_basic:
            plan.append(lambda: rlcli_sweep(work, f"basic {args.seeds}", args.seeds, args.steps, []))
            plan.append(lambda: rlcli_sweep(work, f"joblib {args.seeds} x2", args.seeds, args.steps,
                                            ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]))
        if not args.no_sb3:
            plan.append(lambda: sb3_pairs(args.algo, args.seeds, args.steps))
        for round_ in range(args.rounds):
            units: dict[bool, float] = {}  # this round's one seed (and one compiled seed)
            for measure in plan:
                row = measure()
                if row["row"].startswith("one seed"):
                    units["compiled" in row["row"]] = row["seconds"]
                row["round"] = round_
                row["ratio"] = row["seconds"] / units.get("compiled" in row["row"], units[False])
                rows.append(row)
                print(f"  {row['row']:16} {row['seconds']:7.1f} s  returns {row['returns']}", file=sys.stderr,
                      flush=True)
    env = COMMON[1].removeprefix("env=")
    print(f"\n{args.algo.upper()} {env} (RL-Zoo settings), {args.steps:,} env steps per run, whole processes, "
          f"device={args.device}" + (f"; median (min-max) of {args.rounds} rounds" if args.rounds > 1 else "") + "\n")
    print("| row | runs | wall s | x one seed (compiled: its) | env steps/s, all runs | per run "
          "| final test returns (min / median) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in dict.fromkeys(row["row"] for row in rows):
        mine = [row for row in rows if row["row"] == name]
        seconds = statistics.median(row["seconds"] for row in mine)
        per_run = args.steps / seconds  # every run trains `steps`, all of them within `seconds`
        returns = [r for row in mine for r in row["returns"]]
        print(f"| {name} | {mine[0]['runs']} | {spread([row['seconds'] for row in mine], 1)} | "
              f"{spread([row['ratio'] for row in mine], 2)} | {per_run * mine[0]['runs']:.0f} | {per_run:.0f} | "
              f"{min(returns):.1f} / {statistics.median(returns):.1f} |")
    args.out.write_text(json.dumps({"steps": args.steps, "rounds": args.rounds, "rows": rows}, indent=1) + "\n")


def spread(values: list[float], digits: int) -> str:
    """One value as it is; several as "median (min-max)"."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


if __name__ == "__main__":
    main()
