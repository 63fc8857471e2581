"""Measure env steps and wall time to solve an env with rl-train, over several seeds.

    python scripts/solve_times.py --algo ppo --env CartPole-v1 --seeds 1 2 3 -- train.test_every=5000

Runs `rl-train` as a user would (one process per seed, console off, tuned config), then reads each
run's eval.jsonl and train.log. Wall time is the whole process as the user sees it, imports included.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_one(algo: str, env: str, seed: int, extra: list[str], root: Path,
            above: float | None = None) -> dict[str, object]:
    run_dir = root / f"{algo}_{env}_{seed}"
    rl_train = Path(sys.executable).parent / "rl-train"
    start = time.perf_counter()
    subprocess.run([str(rl_train), f"algo={algo}", f"env={env}", f"seed={seed}", "log.console=false",
                    f"hydra.run.dir={run_dir}", *extra], check=True)
    wall = time.perf_counter() - start
    tests = [json.loads(line) for line in (run_dir / "eval.jsonl").open()]
    done = re.search(r"done: ([\d,]+) env steps in ([\d.]+) s \((\d+) SPS\)", (run_dir / "train.log").read_text())
    assert done, "no summary line in train.log"
    return {
        "seed": seed,
        "env_steps": int(done.group(1).replace(",", "")),
        "train_s": float(done.group(2)),
        "sps": int(done.group(3)),
        "process_s": round(wall, 1),
        "final_test_return": sum(tests[-1]["returns"]) / len(tests[-1]["returns"]),
        "best_test_return": max(sum(t["returns"]) / len(t["returns"]) for t in tests),
        # exploration tasks: when a test first did better than `above` (e.g. -200: reached MountainCar's goal)
        **({"first_above_steps": next((t["env_steps"] for t in tests if sum(t["returns"]) / len(t["returns"]) > above),
                                      None)} if above is not None else {}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", default="ppo")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--above", type=float, default=None,
                        help="also report the env steps of the first test whose mean return exceeds this")
    parser.add_argument("overrides", nargs="*", help="extra rl-train overrides, e.g. train.test_every=5000")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run_one(args.algo, args.env, s, args.overrides, Path(tmp), args.above) for s in args.seeds]
    for row in rows:
        print(json.dumps(row))
    for key in ("env_steps", "train_s", "process_s", "sps", "final_test_return", "best_test_return"):
        values = [float(r[key]) for r in rows]  # type: ignore[arg-type]
        print(f"{key}: median {statistics.median(values):.1f}, min {min(values):.1f}, max {max(values):.1f}")


if __name__ == "__main__":
    main()
