"""A sweep's worker processes (the population launcher's with `hydra.launcher.n_jobs` > 1, the joblib launcher's)
under the faults a sweep meets: Ctrl-C or SIGTERM to rl-train (passed on, so that every running job or population
stops with its checkpoints and the waiting ones do not start), a worker killed from outside (one line), rl-train
itself killed (its workers stop and exit)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from rlcli.run.stop import StopSignals


def in_worker_process() -> bool:
    """Whether this process is a launcher's worker (joblib runs `n_jobs=1` in rl-train's own process)."""
    return multiprocessing.parent_process() is not None


def worker_died(error: Exception, sweep_dir: str, what: str = "population", each: str = "member",
                exit_codes: list[int] | None = None) -> str:
    """One line for a worker process killed from outside (the kernel's out-of-memory killer, `kill -9`): joblib (or
    the standard library's pool, whose error names no exit code: `exit_codes` gives them) then stops the other
    workers too, so every `each` stops where it was, as a killed single run does."""
    codes = re.search(r"exit codes of the workers are \{(.*?)\}", str(error))
    how = f" ({codes.group(1)})" if codes else ""
    if not codes and exit_codes:
        named = [f"{signal.Signals(-c).name}({c})" if c < 0 and -c in signal.valid_signals() else f"EXIT({c})"
                 for c in exit_codes]
        how = f" ({', '.join(named)})"
    return (f"rl-train: a {what} worker process was killed{how}, by the system for memory or by a signal, "
            f"and the other workers were stopped with it; every {each} goes on from its last checkpoint with the same "
            f"command and hydra.sweep.dir={sweep_dir} resume=auto (hydra.launcher.n_jobs=1: one process)")


@contextlib.contextmanager
def signals_passed_on() -> Iterator[dict[str, int | None]]:
    """While worker processes train, Ctrl-C and SIGTERM in this process go on to them: each running job or population
    stops at its next safe point with its checkpoints, as it does in one process, and this process then exits with
    128 + the signal. (Without this the signal interrupted joblib here, which killed the workers: their latest
    training was lost and their status records said "running".) The first signal is kept in the yielded dict."""
    received: dict[str, int | None] = {"signum": None}

    def pass_on(signum: int, frame: Any) -> None:
        if received["signum"] is None:
            received["signum"] = signum
        _note(signum)  # the job or population of this process (n_jobs=1), if one is starting
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


_watching: list[Callable[[], bool]] = []  # whether the launcher is gone (one watch per worker process, reused)


def orphaned() -> bool:
    """In a worker that `stop_when_orphaned` set up: whether its launcher process is gone."""
    return bool(_watching) and _watching[0]()


def launcher_gone_check() -> Callable[[], bool]:
    """How a worker tells that the launcher (rl-train) is gone. joblib's loky workers are its children: their
    parent changes. The population launcher's are forked by a fork server, rl-train's child, which outlives rl-train
    while they run (they hold its liveness pipe): multiprocessing's pipe from rl-train ends instead."""
    parent, launcher = multiprocessing.parent_process(), os.getppid()
    if parent is not None and parent.pid != launcher:  # forked by the server: rl-train is its parent's parent
        return lambda: not parent.is_alive()
    return lambda: os.getppid() != launcher


# in a worker: the signal that stopped the sweep (a job or population it trained stopped on it, or it came between
# them); what joblib hands this worker afterwards returns at once, untrained
_stopped_by: dict[str, int | None] = {"signum": None}
# the trainer's signals of the job being set up here, before its loop catches signals itself (`adopt`)
_adopted: list[StopSignals] = []


def _note(signum: int) -> None:
    remember_stop(signum)
    for signals in _adopted:
        if signals.received is None:
            signals.received, signals.first_at = signum, time.monotonic()


def keep_stops_between_jobs() -> None:
    """In a worker, between jobs (or populations): a signal is the stop of those still to come (joblib's default
    handlers would let SIGTERM kill the idle worker, and SIGINT raise inside joblib's loop), and of a job being set
    up (`adopt`)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: _note(signum))


def adopt(signals: StopSignals) -> bool:
    """A job about to train: False when the sweep was stopped already (it must not train); else a signal from now
    until its loop catches signals itself goes to its `signals`, so that it stops at its first safe point with a
    checkpoint (instead of the signal falling between the set-up and the loop, and the job training to its end)."""
    if _stopped_by["signum"] is not None:
        return False
    _adopted[:] = [signals]
    return True


def release_adopted() -> None:
    _adopted.clear()


def stopped_by() -> int | None:
    return _stopped_by["signum"]


def remember_stop(signum: int | None) -> None:
    if signum is not None and _stopped_by["signum"] is None:
        _stopped_by["signum"] = signum


def stop_when_orphaned(every: float = 1.0) -> None:
    """In a worker: when the launcher process is gone (`kill -9` on rl-train), SIGTERM to this worker, whose
    job or population then stops as on Ctrl-C, with its checkpoints, instead of training on where nobody sees it
    (and holding its run locks against the `resume=auto` that follows)."""
    if _watching:
        return
    gone = launcher_gone_check()
    _watching.append(gone)

    def watch() -> None:
        while not gone():
            time.sleep(every)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="rlcli-launcher-watch", daemon=True).start()


def set_up_worker() -> None:
    """In a worker, before each job or population it is handed: a repeated signal within the echo window is one
    signal, the launcher is watched, and signals between jobs are kept as the stop of those to come."""
    StopSignals.echo_seconds = SIGNAL_ECHO_SECONDS
    stop_when_orphaned()
    keep_stops_between_jobs()


def exit_if_orphaned() -> None:
    """In a worker, after a job or population: when the launcher is gone nobody takes the result, and an idle
    worker would linger in joblib's pool; it exits."""
    if orphaned():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + signal.SIGTERM)
