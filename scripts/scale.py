"""How rlcli's cost grows: PPO env steps per second against num_envs (sync and numpy-vectorized
CartPole), SAC gradient steps per second against batch size, each with the trainer's time account
(which phase bounds the run).

    python scripts/scale.py --out scale.json
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any


def train(overrides: list[str]) -> dict[str, Any]:
    from hydra import compose, initialize_config_dir

    from rlcli.run.compose import conf_dir
    from rlcli.run.state import prepare
    from rlcli.run.trainer import Trainer

    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3", job_name="scale"):
        cfg = compose("config", overrides=[*overrides, "train.test_every=0", "train.stop_reward=null",
                                           "log.console=false", "log.tensorboard=false", "device=cpu"])
    with tempfile.TemporaryDirectory() as run_dir:
        components, state = prepare(cfg)
        trainer = Trainer(components, Path(run_dir), state)
        start = time.perf_counter()
        trainer.run()
        wall = time.perf_counter() - start
    totals = components.clock.totals()
    total = totals.pop("total")
    shares = {k: round(v / total, 3) for k, v in sorted(totals.items(), key=lambda kv: -kv[1]) if v / total >= 0.01}
    return {"wall_s": round(wall, 2), "env_steps": trainer.state.env_steps, "shares": shares}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", type=int, default=[1, 8, 64, 256])
    parser.add_argument("--batches", nargs="+", type=int, default=[256, 1024])
    parser.add_argument("--out", type=Path, default=Path("scale.json"))
    args = parser.parse_args()
    rows = []
    for mode in ("numpy", "sync"):
        for n in args.envs:
            n_steps = 32
            steps = max(32_768, 4 * n_steps * n)
            result = train(["algo=ppo", "env=CartPole-v1", f"train.num_envs={n}", f"train.vector_mode={mode}",
                            f"algo.n_steps={n_steps}", "algo.n_epochs=4", f"algo.batch_size={n_steps * n // 4 or 1}",
                            f"train.total_steps={steps}", "algo.lr_schedule=constant",
                            "algo.clip_range_schedule=constant"])
            result.update(row="ppo", vector_mode=mode, num_envs=n, sps=round(result["env_steps"] / result["wall_s"]))
            print(f"ppo {mode:5} num_envs {n:4}: {result['sps']:7,} SPS  {result['shares']}", flush=True)
            rows.append(result)
    for batch in args.batches:
        steps = 1_000
        result = train(["algo=sac", "env=Pendulum-v1", "train.num_envs=1", f"algo.batch_size={batch}",
                        f"algo.learning_starts={max(batch, 256)}", f"train.total_steps={steps + max(batch, 256)}",
                        "actor.hidden_sizes=[256,256]"])
        updates = result["env_steps"] - max(batch, 256)
        result.update(row="sac", batch_size=batch, updates_per_s=round(updates / result["wall_s"], 1))
        print(f"sac batch {batch:5}: {result['updates_per_s']:6} updates/s  {result['shares']}", flush=True)
        rows.append(result)
    import torch

    args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.platform(),
                                    "torch": torch.__version__, "threads": 1, "rows": rows}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
