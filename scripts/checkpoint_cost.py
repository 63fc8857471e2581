"""Size of a checkpoint and the time one save takes, for PPO on CartPole and SAC with a full 1e6 replay.

    python scripts/checkpoint_cost.py

Builds each trainer from the shipped configs, fills what a real run would hold at that point (the SAC
replay buffer with 1e6 Pendulum transitions), then times run_state.save and a verified load.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir

from rlcli.run.compose import conf_dir
from rlcli.run.state import TrainState, prepare, save
from rlcli.services import checkpoint


def measure(name: str, overrides: list[str], fill_replay: int = 0) -> None:
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3", job_name="bench"):
        cfg = compose("config", overrides=[*overrides, "log.console=false"])
    with tempfile.TemporaryDirectory() as tmp:
        components, _ = prepare(cfg)
        buf = components.buffer
        if fill_replay:
            obs_dim = buf.obs.shape[1]
            chunk = 10_000
            for _ in range(fill_replay // chunk):
                buf._write(torch.randn(chunk, obs_dim), torch.rand(chunk, *buf.actions.shape[1:]) * 2 - 1,
                           torch.randn(chunk), torch.randn(chunk, obs_dim), torch.full((chunk,), 0.99))
        times = []
        for _ in range(3):
            start = time.perf_counter()
            path = save(components, TrainState(), Path(tmp))
            times.append(time.perf_counter() - start)
        start = time.perf_counter()
        checkpoint.load(path)
        load = time.perf_counter() - start
        size = path.stat().st_size
        print(f"{name}: {size / 1e6:.2f} MB, save median {np.median(times):.3f} s "
              f"(min {min(times):.3f}), verified load {load:.3f} s, replay size {len(buf) if fill_replay else 0:,}")
        components.close()


if __name__ == "__main__":
    measure("ppo CartPole-v1", ["algo=ppo", "env=CartPole-v1"])
    measure("sac Pendulum-v1, 1e6 transitions", ["algo=sac", "env=Pendulum-v1"], fill_replay=1_000_000)
