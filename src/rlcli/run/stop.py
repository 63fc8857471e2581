"""How a run stops early: on a fault it cannot go past (RunFailed), or on Ctrl-C / SIGTERM (the first is remembered for
the loop's next safe point, a second raises StopNow). Its own module, importing nothing heavy, so that the console
entry points take it from here."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable
from typing import Any

from rlcli.services.deadlines import DEADLINES


class RunFailed(SystemExit):
    """The run stopped on a fault it cannot go past; `message` is the line printed on stderr. Exit code 1."""

    def __init__(self, message: str) -> None:
        super().__init__(1)
        self.message = message


class StoppedBySignal(SystemExit):
    """Ctrl-C / SIGTERM stopped the run at a safe point with a checkpoint saved. Exit code 128 + the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


class StopNow(KeyboardInterrupt):
    """A second Ctrl-C / SIGTERM while training: stop at once, without the checkpoint of the first."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.run_dir: str | None = None  # set by the trainer it went through, for the line
        self.checkpoint: str | None = None  # the trainer's last good checkpoint ("" when there is none yet)

    def why(self) -> str:
        return f"a second {signal.Signals(self.signum).name}"

    def line(self) -> str:
        """What rl-train prints for it: why it stopped at once, and how to go on."""
        where = self.run_dir or "<run dir>"
        if self.checkpoint == "":
            return (f"rl-train: {self.why()}: stopped at once, before its first checkpoint (nothing trained is kept); "
                    f"rl-train resume={where} starts it afresh")
        last = f" ({self.checkpoint})" if self.checkpoint else ""
        return (f"rl-train: {self.why()}: stopped at once; resume from the last checkpoint{last} with "
                f"rl-train resume={where}")


# How long the first Ctrl-C / SIGTERM waits for the loop's next safe point (the end of an iteration, where it saves a
# checkpoint): a small run gets there in milliseconds; one whose iteration is longer (100,000 envs, a huge update, a
# hung env) stops at once when this has passed, its last checkpoint kept.
STOP_GRACE_SECONDS = 5.0


class StopOverdue(StopNow):
    """The first Ctrl-C / SIGTERM, when the loop did not reach its next safe point within STOP_GRACE_SECONDS."""

    def why(self) -> str:
        return (f"{signal.Signals(self.signum).name}: the run's next safe point was more than "
                f"{STOP_GRACE_SECONDS:g} s away")


def stopped_during_start_up(signum: int, sweep_dir: str | None = None) -> str:
    """The line rl-train prints when a signal stops it before training began (`sweep_dir`: a sweep's job was
    starting, its earlier jobs may have trained)."""
    name = signal.Signals(signum).name
    if sweep_dir is not None:
        return (f"rl-train: {name} while a sweep's job was starting: stopped; finish the sweep with the same command "
                f"plus hydra.sweep.dir={sweep_dir} resume=auto (its finished jobs are skipped)")
    return (f"rl-train: {name} during start-up: stopped before training began, nothing was trained (a run "
            "directory it made starts fresh with rl-train resume=<it>)")


def sweep_being_run(argv: list[str]) -> str | None:
    """The sweep's directory when this rl-train runs a -m sweep (as Hydra has it for the job it was starting, else as
    typed), else None."""
    if not any(a in ("-m", "--multirun") for a in argv):
        return None
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            return str(HydraConfig.get().sweep.dir)
    except Exception:  # noqa: BLE001  (Hydra half set up when the signal landed: the command line says)
        pass
    typed = [a.split("=", 1)[1] for a in argv if a.startswith("hydra.sweep.dir=")]
    return typed[-1] if typed else "<the sweep's directory>"


_start_up: dict[str, int | None] = {"signum": None}


def note_start_up_signal(signum: int) -> None:
    """rl-train's start-up handler (entry/cli.py) stops start-up by raising KeyboardInterrupt where the signal
    lands. Where Python ignores exceptions (a weakref callback inside an import, a `__del__`) that raise is lost and
    start-up goes on; the signal noted here is raised again by the loop's `StopSignals.catch()`, the first place
    after start-up that handles signals, so start-up ends there as it would have (nothing trained) instead of the
    run training to its end."""
    _start_up["signum"] = signum


def raise_lost_signal() -> None:
    """Raise now the KeyboardInterrupt of a signal noted by `note_start_up_signal` whose own raise Python lost;
    nothing without one. Called where a tool acts on it: the training loop's `StopSignals.catch()`, and rl-eval
    before each write."""
    if _start_up["signum"] is not None:
        _start_up["signum"] = None
        raise KeyboardInterrupt


class StopSignals:
    """`received` is the first SIGINT / SIGTERM since `catch()` (None: none yet); a second raises StopNow."""

    # A repeat of the first signal within this many seconds is the same signal delivered twice, not a second one:
    # a launcher's worker process (sweeps/worker_processes.py's users set it there) gets a terminal's Ctrl-C from its
    # process group and again from the launcher, which passes every signal on. 0 elsewhere.
    echo_seconds: float = 0.0

    def __init__(self, grace: float | None = None) -> None:
        self.received: int | None = None
        self.first_at = 0.0  # when `received` came (time.monotonic)
        # seconds the first signal waits for the loop's safe point before stopping at once (None: it waits, as a
        # sweep's jobs and a population do: their safe point saves every job or member, and their launchers say how
        # to go on)
        self.grace = grace

    def catch(self) -> Callable[[], None]:
        """Install the handlers; returns what puts the previous ones back. Not on the main thread (some launchers),
        signals are left alone."""
        raise_lost_signal()  # a start-up signal whose KeyboardInterrupt Python lost

        def handler(signum: int, frame: Any) -> None:
            if self.received is not None:
                if signum == self.received and time.monotonic() - self.first_at < self.echo_seconds:
                    return
                raise StopNow(signum)
            self.received, self.first_at = signum, time.monotonic()
            if self.grace is not None:
                DEADLINES.arm("stop", self.grace, lambda: _raise_overdue(signum))

        previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):
                previous[sig] = signal.signal(sig, handler)

        give_back_alarm = DEADLINES.install() if previous and self.grace is not None else (lambda: None)

        def restore() -> None:
            DEADLINES.disarm("stop")
            give_back_alarm()
            for sig, old in previous.items():
                signal.signal(sig, old)

        return restore

    @staticmethod
    def at_safe_point() -> None:
        """The loop reached the point where it stops for the first signal: no deadline hurries it from here on
        (its checkpoint may take as long as it takes; a second signal still stops at once)."""
        DEADLINES.disarm("stop")


def _raise_overdue(signum: int) -> None:
    raise StopOverdue(signum)
