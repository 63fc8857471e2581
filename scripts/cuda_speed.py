"""Steady-state env steps per second of rl-train runs, from their train.log: the issue's GPU rows in one call.

    python scripts/cuda_speed.py --out speed.json --deadline 300 sac-compiled-capture sac-compiled sac-eager ppo

Each row is a fresh `rl-train` process. A row's steady rate is measured between its log lines once compiling is
over (the env steps from the second logged step to the last, over the seconds between those lines), so the first
update's tracing and compiling is left out of it; the whole process's wall time is given too. Rows run in the order
named and stop at the deadline (a row that would start after it is skipped, and said so), so that a lent GPU's
minutes end with what was asked first.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

SAC = ["algo=sac", "env=Pendulum-v1", "train.total_steps=4000", "train.log_every=500"]  # RL-Zoo's (conf/tuned)
ROWS: dict[str, tuple[list[str], dict[str, str]]] = {
    "sac-eager": (SAC, {}),
    "sac-compiled-nographs": ([*SAC, "compile=true"], {"RLCLI_CUDA_GRAPHS": "0"}),
    "sac-compiled": ([*SAC, "compile=true"], {}),
    "sac-compiled-capture": ([*SAC, "compile=true"], {"RLCLI_CUDA_GRAPHS": "capture"}),
    "ppo": (["algo=ppo", "env=CartPole-v1", "train.log_every=10000", "train.stop_reward=null"], {}),
    "ppo-compiled": (["algo=ppo", "env=CartPole-v1", "compile=true", "train.log_every=10000",
                      "train.stop_reward=null"], {}),
}
LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[rlcli\]\[INFO\] - step (\d+) \|")


def steady_rate(log: str) -> float | None:
    """Env steps per second between the second logged step and the last (None with fewer than three lines)."""
    points = [(datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f"), int(m.group(2)))
              for m in map(LINE.match, log.splitlines()) if m]
    if len(points) < 3:
        return None
    (t0, s0), (t1, s1) = points[1], points[-1]
    return (s1 - s0) / max((t1 - t0).total_seconds(), 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rows", nargs="+", choices=list(ROWS))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--deadline", type=float, default=500, help="seconds after which no row starts")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--profile", action="store_true",
                        help="run each row under cProfile and print its 25 most costly calls by own time (a wait for "
                             "the GPU shows as the call that waited: .item(), .cpu(), a host-to-device copy)")
    args = parser.parse_args()
    started, results = time.monotonic(), {}
    for name in args.rows:
        left = args.deadline - (time.monotonic() - started)
        if left < 30:
            print(f"{name}: skipped, {left:.0f} s left of the deadline", flush=True)
            continue
        overrides, env = ROWS[name]
        run_dir = Path(tempfile.mkdtemp(prefix=f"speed-{name}-"))
        profiled = ["-m", "cProfile", "-o", str(run_dir / "profile.prof")] if args.profile else []
        command = [sys.executable, *profiled, "-m", "rlcli", *overrides, f"device={args.device}",
                   "log.tensorboard=false", "log.console=false", "train.test_every=0", f"hydra.run.dir={run_dir}"]
        begun = time.monotonic()
        try:
            done = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, timeout=left)
            code = done.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
        wall = time.monotonic() - begun
        log = (run_dir / "train.log").read_text() if (run_dir / "train.log").exists() else ""
        rate = steady_rate(log)
        compiles = re.findall(r"first compiled update took ([\d.]+) s", log)
        results[name] = {"exit": code, "wall_s": round(wall, 1), "steady_sps": rate and round(rate, 1),
                         "compile_s": [float(c) for c in compiles], "overrides": overrides, "env": env}
        print(f"{name}: exit {code}, process {wall:.1f} s, steady {rate and round(rate, 1)} env steps/s, "
              f"compiles {compiles}", flush=True)
        if code != 0:
            print((done.stderr if code != "timeout" else log)[-1500:], flush=True)
        if args.profile and (run_dir / "profile.prof").exists():
            import pstats

            pstats.Stats(str(run_dir / "profile.prof")).sort_stats("tottime").print_stats(25)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
