"""The population launcher's worker processes (`hydra.launcher.n_jobs`): how many to start, and what happens to
them under the faults a sweep meets: Ctrl-C or SIGTERM to rl-train (passed on, so that every population stops with
its checkpoints), a worker killed from outside (one line), rl-train itself killed (its workers stop and exit)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
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


def worker_died(error: Exception, sweep_dir: str) -> str:
    """One line for a worker process killed from outside (the kernel's out-of-memory killer, `kill -9`): joblib
    then stops the other workers too, so every member stops where it was, as a killed single run does."""
    codes = re.search(r"exit codes of the workers are \{(.*?)\}", str(error))
    how = f" ({codes.group(1)})" if codes else ""
    return (f"rl-train: a population worker process was killed{how}, by the system for memory or by a signal, "
            "and the other workers were stopped with it; every member goes on from its last checkpoint with the same "
            f"command and hydra.sweep.dir={sweep_dir} resume=auto (hydra.launcher.n_jobs=1: one process)")


@contextlib.contextmanager
def signals_passed_on() -> Iterator[dict[str, int | None]]:
    """While worker processes train the populations, Ctrl-C and SIGTERM in this process go on to them: each
    population stops at its next safe point with its members' checkpoints, as it does in one process, and this
    process then exits with 128 + the signal. (Without this the signal interrupted joblib here, which killed the
    workers: their members' latest training was lost and their status records said "running".) The first signal is
    kept in the yielded dict."""
    received: dict[str, int | None] = {"signum": None}

    def pass_on(signum: int, frame: Any) -> None:
        if received["signum"] is None:
            received["signum"] = signum
        for worker in multiprocessing.active_children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signum)  # type: ignore[arg-type]

    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError):  # not the main thread: signals are left alone
            previous[sig] = signal.signal(sig, pass_on)
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# a worker's repeat of its first signal this soon after it is that signal again (its process group's, then the
# launcher's), not a second one (run/stop.py)
SIGNAL_ECHO_SECONDS = 1.0


_watching: list[int] = []  # the launcher process a worker watches (one watch per worker process, which joblib reuses)


def orphaned() -> bool:
    """In a worker that `stop_when_orphaned` set up: whether its launcher process is gone."""
    return bool(_watching) and os.getppid() != _watching[0]


# in a worker: the signal that stopped the sweep (a population it trained stopped on it, or it came between
# populations); the populations joblib hands this worker afterwards return at once, untrained
_stopped_by: dict[str, int | None] = {"signum": None}


def keep_stops_between_populations() -> None:
    """In a worker, between populations: a signal is the stop of the populations still to come (joblib's default
    handlers would let SIGTERM kill the idle worker, and SIGINT raise inside joblib's loop)."""
    def remember(signum: int, frame: Any) -> None:
        if _stopped_by["signum"] is None:
            _stopped_by["signum"] = signum

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, remember)


def stopped_by() -> int | None:
    return _stopped_by["signum"]


def remember_stop(signum: int | None) -> None:
    if signum is not None and _stopped_by["signum"] is None:
        _stopped_by["signum"] = signum


def stop_when_orphaned(every: float = 1.0) -> None:
    """In a worker: when the launcher process is gone (`kill -9` on rl-train), SIGTERM to this worker, whose
    population then stops as on Ctrl-C, with its members' checkpoints, instead of training on where nobody sees
    it (and holding its members' run locks against the `resume=auto` that follows)."""
    if _watching:
        return
    launcher = os.getppid()
    _watching.append(launcher)

    def watch() -> None:
        while os.getppid() == launcher:
            time.sleep(every)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="rlcli-launcher-watch", daemon=True).start()
