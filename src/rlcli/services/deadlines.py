"""Deadlines for the main thread, on its one real-time timer (SIGALRM): an env step that runs past
train.step_timeout, and a run that has not reached its next safe point a few seconds after the first Ctrl-C.

Why a signal and not a thread: the code that hangs is the env's (a simulator in a sleep or a busy loop, or, for
async vector envs, this process waiting on a worker's pipe); only an exception raised in the main thread ends it,
and a signal is the one thing that interrupts a blocking wait there. A deadline is armed only while it is wanted
(per env step only when train.step_timeout is set), so a run without one never touches the timer. Outside the main
thread, or before `install()`, nothing is armed: a deadline is then simply not enforced.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class StepTimedOut(BaseException):
    """An env step ran past its deadline. A BaseException, so that an env's own `except Exception` around a
    blocking call does not swallow it; the collector turns it into the one-line EnvError."""

    def __init__(self, seconds: float) -> None:
        super().__init__(seconds)
        self.seconds = seconds


class Deadlines:
    """Named deadlines (time.monotonic) sharing ITIMER_REAL: the timer is set to the soonest, and when it fires every
    deadline that is due is dropped and its `expire` called (it raises, in the main thread, where the run is)."""

    def __init__(self) -> None:
        self._at: dict[str, tuple[float, Callable[[], None]]] = {}
        self._installed = 0  # nested install() calls (a population's trainers inside its loop)
        self._previous: Any = None
        self.step_seconds: float | None = None  # train.step_timeout while a run steps its envs (None: off)

    @property
    def active(self) -> bool:
        return self._installed > 0

    def install(self, step_seconds: float | None = None) -> Callable[[], None]:
        """Take SIGALRM for the run (main thread only: elsewhere deadlines stay off); returns what gives it back."""
        if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
            return lambda: None
        if self._installed == 0:
            self._previous = signal.signal(signal.SIGALRM, self._on_alarm)
        self._installed += 1
        before = self.step_seconds
        if step_seconds is not None:
            self.step_seconds = step_seconds

        restored: list[bool] = []

        def restore() -> None:
            if restored:  # once
                return
            restored.append(True)
            self.step_seconds = before
            self._installed -= 1
            if self._installed == 0:
                self._at.clear()
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, self._previous)

        return restore

    def arm(self, name: str, seconds: float, expire: Callable[[], None]) -> None:
        """Call `expire` (which raises) in `seconds` unless `disarm(name)` comes first; no-op when not installed."""
        if self._installed:
            self._at[name] = (time.monotonic() + seconds, expire)
            self._set_timer()

    def disarm(self, name: str) -> None:
        if self._at.pop(name, None) is not None:
            self._set_timer()

    def armed(self, name: str) -> bool:
        return name in self._at

    def call_within_step_deadline(self, step: Callable[[Any], T], arg: Any) -> T:
        """`step(arg)`, raising StepTimedOut if it runs past `step_seconds` (plain `step(arg)` when that is off)."""
        seconds = self.step_seconds
        if seconds is None or not self._installed:
            return step(arg)
        self.arm("step", seconds, lambda: _raise_timed_out(seconds))
        try:
            return step(arg)
        finally:
            self.disarm("step")

    def _set_timer(self) -> None:
        if not self._at:
            signal.setitimer(signal.ITIMER_REAL, 0)
            return
        soonest = min(at for at, _ in self._at.values())
        signal.setitimer(signal.ITIMER_REAL, max(soonest - time.monotonic(), 1e-4))

    def _on_alarm(self, signum: int, frame: Any) -> None:
        now = time.monotonic()
        due = [name for name, (at, _) in self._at.items() if at <= now + 1e-3]
        expiring = [self._at.pop(name)[1] for name in due]
        with contextlib.suppress(OSError):
            self._set_timer()  # the deadlines still ahead
        for expire in expiring:
            expire()


def _raise_timed_out(seconds: float) -> None:
    raise StepTimedOut(seconds)


DEADLINES = Deadlines()
