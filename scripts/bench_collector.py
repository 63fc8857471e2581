"""Collection throughput: env steps per second of PPO's collect phases with collector=local (sync and
async vector envs) against collector=ray with 1..N workers, on a slow env and on MuJoCo.

Only collect phases are timed (acting, env steps, moving fragments, the learner's buffer adds and GAE),
after one warm-up phase (the workers' first weights); no update runs in between.

    python scripts/bench_collector.py --out collector.json
    python scripts/bench_collector.py --envs slow-spin --workers 1 2 4
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

ENVS = {  # name -> overrides
    "slow-spin": ["env=gym", "env.id=SlowCartPole-v1", "+env.kwargs.step_ms=1", "+env.kwargs.work=spin"],
    "slow-sleep": ["env=gym", "env.id=SlowCartPole-v1", "+env.kwargs.step_ms=1", "+env.kwargs.work=sleep"],
    "halfcheetah": ["env=HalfCheetah-v5"],
}


def collect_rate(overrides: list[str], phases: int) -> dict[str, Any]:
    from rlcli.run.build import build
    from rlcli.run.compose import compose_config

    cfg = compose_config([*overrides, "algo=ppo", "device=cpu", "log.console=false", "log.tensorboard=false"])
    components = build(cfg)
    try:
        collector, learner = components.collector, components.learner
        collector.collect(learner)  # warm-up
        clock = components.clock
        before = dict(clock.seconds)
        start, steps = time.perf_counter(), 0
        for _ in range(phases):
            steps += collector.collect(learner).steps
        wall = time.perf_counter() - start
        waited = {k: round(clock.seconds[k] - before.get(k, 0.0), 2) for k in ("act", "env", "buffer")}
    finally:
        components.close()
    return {"env_steps": steps, "wall_s": round(wall, 2), "sps": round(steps / wall), "phases_s": waited}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--num-envs", type=int, default=8, help="envs in all (split over the workers)")
    parser.add_argument("--n-steps", type=int, default=64, help="steps per env in one collect phase")
    parser.add_argument("--phases", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("collector.json"))
    args = parser.parse_args()
    common = [f"train.num_envs={args.num_envs}", f"algo.n_steps={args.n_steps}",
              f"algo.batch_size={args.n_steps * args.num_envs}", "env.normalize_obs=false",
              "env.normalize_reward=false"]
    rows = []
    for env in args.envs:
        setups = [("local", "sync", ["train.vector_mode=sync"]), ("local", "async", ["train.vector_mode=async"])]
        for w in args.workers:
            if args.num_envs % w == 0:
                setups.append((f"ray x{w}", "sync", ["train.vector_mode=sync", "collector=ray",
                                                     f"collector.workers={w}"]))
        for label, mode, extra in setups:
            result = collect_rate([*ENVS[env], *common, *extra], args.phases)
            result.update(env=env, collector=label, vector_mode=mode)
            print(f"{env:12} {label:8} {mode:5}: {result['sps']:7,} env steps/s  {result['phases_s']}", flush=True)
            rows.append(result)
    meta = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "machine": platform.platform(),
            "num_envs": args.num_envs, "n_steps": args.n_steps, "phases": args.phases}
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
