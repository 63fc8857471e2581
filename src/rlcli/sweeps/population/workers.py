"""How many worker processes the population launcher starts (`hydra.launcher.n_jobs`). What happens to them under
the faults a sweep meets is sweeps/worker_processes.py's, shared with the joblib launcher."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity, which a container or `taskset` narrows)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def available_memory() -> int | None:
    """Bytes of memory available to new processes (Linux's MemAvailable); None where it cannot be read."""
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


# what one worker process is allowed for `n_jobs=auto` (a 4-member PPO CartPole population peaked at 0.29 GB)
MEMORY_PER_WORKER = 2**30


def workers_for(n_jobs: int | str, configs: Sequence[DictConfig], cores: int | None = None,
                memory: int | None = None) -> int:
    """`n_jobs=auto`: on a CPU, one process per core (per `torch_threads` cores; torch_threads=0 takes them all),
    at most one per job and one per GiB of available memory: on 2 cores, 8 PPO CartPole seeds took 50-53 s as two
    populations of 4 against 72-80 s as one (scripts/population_bench.py, 2026-11-26); with as many cores as seeds
    each seed is a process of its own. On a GPU, one: the members share the device in one batched population.
    Without joblib (the `sweep` extra), one, said in one line."""
    if n_jobs != "auto":
        return int(n_jobs)
    if any(not _on_cpu(str(cfg.get("device", "auto"))) for cfg in configs):
        return 1
    cores = cores or usable_cores()
    threads = int(configs[0].get("torch_threads", 1))
    memory = memory if memory is not None else available_memory()
    workers = min(cores // threads if threads > 0 else 1, len(configs),
                  memory // MEMORY_PER_WORKER if memory is not None else len(configs))
    if workers < 2:
        return 1
    try:
        import joblib  # noqa: F401
    except ImportError:
        print(f"rl-train: hydra.launcher.n_jobs=auto: the populations train in this one process; {workers} processes "
              "(one per core) need joblib: pip install -e '.[sweep]'", file=sys.stderr)
        return 1
    return workers


def _on_cpu(device: str) -> bool:
    if device == "auto":
        import torch

        return not torch.cuda.is_available()
    return device == "cpu"
