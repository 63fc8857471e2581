"""Deadlines for the main thread, on its one real-time timer (SIGALRM): an env step that runs past
train.step_timeout, and a run that has not reached its next safe point a few seconds after the first Ctrl-C.

Why a signal and not a thread: the code that hangs is the env's (a simulator in a sleep or a busy loop, or, for
async vector envs, this process waiting on a worker's pipe); only an exception raised in the main thread ends it,
and a signal is the one thing that interrupts a blocking wait there. A deadline is armed only while it is wanted
(per env step only when train.step_timeout is set). A caller's own alarm is paused while a run holds the timer and
re-armed for what was left of it afterwards. Outside the main thread, or before `install()`, nothing is armed: a
deadline is then simply not enforced.
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
    """Named deadlines (time.monotonic) and the env step's, sharing ITIMER_REAL: the timer is set to the soonest, and
    when it fires every deadline that is due is dropped and its `expire` called (it raises, in the main thread,
    where the run is).

    The step's deadline costs no system call per step: a step notes when it started, and the timer, once set, stays
    set; when it fires with no step late it is set again for the step in progress (or left off between steps). So
    a run with train.step_timeout=T takes at most one spare alarm every T seconds (a wait it interrupts is resumed,
    PEP 475), against ~3 us a step for setting and clearing the timer around each one."""

    def __init__(self) -> None:
        self._at: dict[str, tuple[float, Callable[[], None]]] = {}
        self._installed = 0  # nested install() calls (a population's trainers inside its loop)
        self._previous: Any = None
        self._caller_timer: tuple[float, float] = (0.0, 0.0)  # the caller's timer when rlcli took it
        self._caller_taken_at = 0.0
        self._timer_at: float | None = None  # when the timer fires (None: not set)
        self._step_started: float | None = None  # the env step in progress began (None: none is)
        self.step_seconds: float | None = None  # train.step_timeout while a run steps its envs (None: off)

    @property
    def active(self) -> bool:
        return self._installed > 0

    def install(self, step_seconds: float | None = None) -> Callable[[], None]:
        """Take SIGALRM for the run (main thread only: elsewhere deadlines stay off); returns what gives it back."""
        if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
            return lambda: None
        if self._installed == 0:
            # the caller's own alarm (signal.alarm, pytest-timeout's): paused while rlcli holds the timer, re-armed for
            # what was left of it when rlcli gives the timer back
            self._caller_timer, self._caller_taken_at = signal.getitimer(signal.ITIMER_REAL), time.monotonic()
            signal.setitimer(signal.ITIMER_REAL, 0)
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
                self._step_started = self._timer_at = None
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, self._previous)
                left, interval = self._caller_timer
                if left > 0:  # due while rlcli held the timer: it fires now, late rather than never
                    left = max(left - (time.monotonic() - self._caller_taken_at), 1e-4)
                    signal.setitimer(signal.ITIMER_REAL, left, interval)

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
        self._step_started = now = time.monotonic()
        if self._timer_at is None or self._timer_at > now + seconds:
            self._set_timer()
        try:
            return step(arg)
        finally:
            self._step_started = None

    def _step_deadline(self) -> float | None:
        started, seconds = self._step_started, self.step_seconds
        return None if started is None or seconds is None else started + seconds

    def _set_timer(self) -> None:
        candidates = [at for at, _ in self._at.values()]
        step_at = self._step_deadline()
        if step_at is not None:
            candidates.append(step_at)
        if not candidates:
            self._timer_at = None
            signal.setitimer(signal.ITIMER_REAL, 0)
            return
        self._timer_at = soonest = min(candidates)
        signal.setitimer(signal.ITIMER_REAL, max(soonest - time.monotonic(), 1e-4))

    def _on_alarm(self, signum: int, frame: Any) -> None:
        now = time.monotonic() + 1e-3
        self._timer_at = None
        due = [name for name, (at, _) in self._at.items() if at <= now]
        expiring = [self._at.pop(name)[1] for name in due]
        step_at, seconds = self._step_deadline(), self.step_seconds
        if step_at is not None and step_at <= now and seconds is not None:
            self._step_started = None
            expiring.append(lambda: _raise_timed_out(seconds))
        with contextlib.suppress(OSError):
            self._set_timer()  # the deadlines still ahead (the step in progress, when it is not late yet)
        for expire in expiring:
            expire()


def _raise_timed_out(seconds: float) -> None:
    raise StepTimedOut(seconds)


DEADLINES = Deadlines()
