"""How many worker processes the population launcher starts (`hydra.launcher.n_jobs`), and how they start. What
happens to them under the faults a sweep meets is sweeps/worker_processes.py's, shared with the joblib launcher."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
    at most one per job and one per GiB of available memory: on 2 cores, 8 PPO CartPole seeds took 42-46 s as two
    populations of 4 against 66-67 s as one (scripts/population_bench.py, 2026-11-27); with as many cores as seeds
    each seed is a process of its own. On a GPU, one: the members share the device in one batched population.
    The workers are the standard library's process pool: the base install runs them (no joblib)."""
    if n_jobs != "auto":
        return int(n_jobs)
    if any(not _on_cpu(str(cfg.get("device", "auto"))) for cfg in configs):
        return 1
    cores = cores or usable_cores()
    threads = int(configs[0].get("torch_threads", 1))
    memory = memory if memory is not None else available_memory()
    workers = min(cores // threads if threads > 0 else 1, len(configs),
                  memory // MEMORY_PER_WORKER if memory is not None else len(configs))
    return max(workers, 1)


def _on_cpu(device: str) -> bool:
    if device == "auto":
        import torch

        return not torch.cuda.is_available()
    return device == "cpu"


# what a population worker imports before it trains (torch, gymnasium, Hydra's job set-up, rlcli's build and the
# populations' updates): 2.0 s of each worker's start here; with compile=true torch's compiler too (3.3 s more)
WORKER_MODULES = ("torch", "gymnasium", "hydra.core.utils", "rlcli.run.state", "rlcli.run.trainer",
                  "rlcli.sweeps.population.launch", "rlcli.sweeps.population.loop",
                  "rlcli.sweeps.population.lockstep")
COMPILER_MODULES = ("torch._dynamo", "torch._inductor.config", "torch._inductor.compile_fx")


def start_worker_server(compiled: bool) -> None:
    """Start the process that the population workers are forked from (multiprocessing's fork server), with what
    they import already imported, in the background: rl-train calls it first, so that the server imports while
    rl-train checks and composes the sweep's jobs, and every worker starts with its imports done. (Started
    with joblib's own `loky` method, each worker imported torch, rlcli and, for compile=true, torch's compiler
    itself after rl-train's checks: 3-6 s of a 50 s sweep of 8 PPO CartPole seeds here, before any member
    stepped.) The server is a new process that has only imported (no threads, nothing run), so the workers
    forked from it start as clean as loky's; like any multiprocessing start method but fork, each imports the
    main script (rl-train's, which does nothing on import). It exits with rl-train. No-op where the platform
    has no fork server (the workers are then spawned)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return
    from multiprocessing import forkserver

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([*WORKER_MODULES, *(COMPILER_MODULES if compiled else ())])
    forkserver.ensure_running()


def worker_context(compiled: bool) -> Any:
    """The start method of the population workers: the fork server's (started now if rl-train did not start it
    first), or spawn where there is none (never fork: rl-train's threads and torch's state would be copied)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    start_worker_server(compiled)  # already running: the server and its imports stay as they are
    return multiprocessing.get_context("forkserver")


def may_start_early(n_jobs: str, device: str) -> bool:
    """From rl-train's arguments (`hydra.launcher.n_jobs`, `device`): whether the sweep will likely start worker
    processes (`workers_for`), so that their server is worth starting before the sweep is checked."""
    if n_jobs == "auto":
        return usable_cores() >= 2 and not device.startswith("cuda")
    return n_jobs.isdigit() and int(n_jobs) > 1
