"""Level-Based Foraging figures (issue #58): rlcli's MAPPO, IPPO, VDN and QMIX on `env=lbf`
(Foraging-8x8-2p-2f-coop-v3, 2 players, 2 foods, each food needs both players, 50 steps; team return 1.0 when every
food is eaten, 0.004 for a random policy), over seeds, with the shipped settings (conf/algo/<algo>.yaml,
conf/env/lbf.yaml, and conf/tuned/<algo>/lbf.yaml where there is one: mappo, vdn). BenchMARL's side:
scripts/benchmarl_lbf.py.

    nice -n 10 python scripts/lbf_runs.py --work /tmp/lbf --algos mappo ippo --seeds 0 1 2 --steps 1500000
    nice -n 10 python scripts/lbf_runs.py --work /tmp/lbf_ent --set algo.ent_coef=0.01      # a variant
    nice -n 10 python scripts/lbf_runs.py --work /tmp/lbfq --algos vdn --steps 2000000 --test-every 200000
    python scripts/lbf_runs.py --work /tmp/lbf --summary-only          # the table again from the run dirs

Steps are agent steps (rows: one per agent, 2 per team step) for MAPPO and IPPO, and team steps (a row is a copy of
the env) for VDN and QMIX, which run in joint mode. Each run's tests are 20 deterministic (argmax) episodes every
--test-every steps, and a run trains its whole budget (no stop at the stop reward). The table gives the last test's
team return (mean and 95% t-interval over the seeds), each seed's, the first tested step at which a seed's test return
reached 0.95 (LBF's threshold) and the wall seconds of each whole rl-train process. Runs go one at a time; a run dir
that already holds a finished run is summarized, not trained again.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

T_95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}  # two-sided, n-1 dof


def tests(run_dir: Path) -> list[tuple[int, float]]:
    path = run_dir / "eval.jsonl"
    if not path.is_file():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(int(r["env_steps"]), sum(r["returns"]) / len(r["returns"])) for r in records if "returns" in r]


def run(rl_train: Path, work: Path, algo: str, seed: int, steps: int, test_every: int,
        extra: list[str]) -> float | None:
    run_dir = work / f"{algo}_s{seed}"
    done = tests(run_dir)
    if done and done[-1][0] >= steps:
        return None  # already there
    shutil.rmtree(run_dir, ignore_errors=True)
    command = [str(rl_train), f"algo={algo}", "env=lbf", f"seed={seed}", f"train.total_steps={steps}",
               f"train.test_every={test_every}", "train.test_episodes=20", "train.stop_reward=null",
               "log.console=false", *extra, f"hydra.run.dir={run_dir}"]
    print(" ".join(command), flush=True)
    started = time.perf_counter()
    subprocess.run(command, check=True)
    seconds = time.perf_counter() - started
    (run_dir / "wall_s.txt").write_text(f"{seconds:.1f}\n")
    return seconds


def summary(work: Path, algos: list[str], seeds: list[int]) -> str:
    lines = ["| algo | final test, mean ± 95% t | each seed (agent steps) | first test >= 0.95 | wall s each |",
             "| --- | --- | --- | --- | --- |"]
    for algo in algos:
        finals, each, reached, walls = [], [], [], []
        for seed in seeds:
            run_dir = work / f"{algo}_s{seed}"
            found = tests(run_dir)
            if not found:
                continue
            steps, final = found[-1]
            finals.append(final)
            each.append(f"{final:.2f} ({steps:,})")
            first = next((s for s, r in found if r >= 0.95), None)
            reached.append("-" if first is None else f"{first:,}")
            wall = run_dir / "wall_s.txt"
            walls.append(wall.read_text().strip() if wall.is_file() else "?")
        if not finals:
            continue
        n = len(finals)
        mean = sum(finals) / n
        half = T_95.get(n - 1, 1.96) * math.sqrt(sum((f - mean) ** 2 for f in finals) / (n - 1) / n) if n > 1 else 0.0
        lines.append(f"| {algo} | {mean:.2f} ± {half:.2f} | {', '.join(each)} | {', '.join(reached)} | "
                     f"{', '.join(walls)} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/lbf"))
    p.add_argument("--algos", nargs="+", default=["mappo", "ippo"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=1_500_000, help="agent steps a run")
    p.add_argument("--test-every", type=int, default=250_000)
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="more overrides for every run (a variant: give it its own --work)")
    p.add_argument("--summary-only", action="store_true")
    args = p.parse_args()
    rl_train = Path(sys.executable).parent / "rl-train"
    args.work.mkdir(parents=True, exist_ok=True)
    if not args.summary_only:
        for algo in args.algos:
            for seed in args.seeds:
                run(rl_train, args.work, algo, seed, args.steps, args.test_every, args.set)
    table = summary(args.work, args.algos, args.seeds)
    (args.work / "summary.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
