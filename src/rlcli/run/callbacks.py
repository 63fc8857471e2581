"""The loop's points where code runs besides collecting and updating: the run's own steps and a user's functions.

The trainer calls each `Callback` at eight points of every run, in the order of one list: the run's own callbacks
(builtin_callbacks.py: the budget warnings, the log and its header, the non-finite guard, the schedules, the test
phase, video, logs, the stop line, the signal's safe point, the checkpoints) with a user's, a pruner's or a sweep's
among them. A callback reads the run through a `RunContext` (its directory, its counters, the algorithm and its
networks, the config, the logger, the iteration under way) and can log scalars beside the run's own. Returning
True, or a short reason string, from `after_collect`, `after_update`, `after_test` or `after_iteration` asks the run
to stop at the end of that iteration: it is then saved as a Ctrl-C would save it, not marked finished, so `resume=`
continues it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from rlcli.collectors.local import CollectStats
    from rlcli.collectors.testing import TestStats
    from rlcli.run.state import TrainState
    from rlcli.services.log import RunLogger

# What an after_* method returns: None/False to go on, True or a reason ("pruned", "plateau") to stop cleanly.
StopRequest = bool | str | None


@dataclass
class Iteration:
    """One pass of the loop: a collect phase, the update that followed it (once learning starts), and what the
    callbacks after them decided. `RunContext.iteration` is the one under way."""

    previous: int  # env steps before this iteration's collect
    stats: CollectStats  # the collect phase's: steps, finished episodes' returns and lengths
    scheduled: dict[str, float] = field(default_factory=dict)  # the schedules' values for this iteration
    metrics: dict[str, Any] = field(default_factory=dict)  # the update's, with schedule_<name> for each schedule
    sps: float = 0.0  # env steps per second of this process so far
    last_phase: bool = False  # the budget is reached with this iteration
    stop: str | None = None  # why the run ends after this iteration: stop_reward, pruned, a callback's reason
    tested: TestStats | None = None  # this iteration's test episodes when the caller ran them (a population)

    @property
    def ends_early(self) -> bool:
        """The run stops after this iteration, before its budget (at the budget's end a stop is simply the end)."""
        return self.stop is not None and not self.last_phase


@dataclass(eq=False)
class RunContext:
    """What a callback sees of the run it is called from; the same object at every point of one run."""

    run_dir: Path
    state: TrainState  # env_steps, updates, episodes, tests, last_test_return, best_test_return, ...
    algo: Any  # the algorithm: `algo.networks` holds its torch modules (and the observation normalizer)
    config: DictConfig
    iteration: Iteration | None = None  # the loop's iteration under way (None before the first collect)
    _logger: RunLogger | None = None
    # where this process's clock started (the first collect, or a rollback): perf_counter, env steps, train seconds
    _since: tuple[float, int, float] = (0.0, 0, 0.0)

    @property
    def env_steps(self) -> int:
        return self.state.env_steps

    @property
    def logger(self) -> RunLogger:
        """The run's logger, open from the run's own on_start on: `message(line)` (console and train.log),
        `scalars({tag: value}, env_steps)` (TensorBoard and the tracked runs), `table(env_steps)`, `result(line)`."""
        if self._logger is None:
            raise RuntimeError("the run's logger opens at on_start, before the first callback of yours is called")
        return self._logger

    @logger.setter
    def logger(self, logger: RunLogger) -> None:
        self._logger = logger

    @property
    def sps(self) -> float:
        """Env steps per second of this process so far (since its first collect, or a rollback)."""
        started, steps, _ = self._since
        return (self.state.env_steps - steps) / (time.perf_counter() - started)

    @property
    def train_seconds(self) -> float:
        """The run's training seconds: those of the processes before this one and this one's so far."""
        started, _, before = self._since
        return before + time.perf_counter() - started

    def _restart_clock(self) -> None:
        """sps and train_seconds count from here (the run's start, or a rollback that rewound the counters)."""
        self._since = (time.perf_counter(), self.state.env_steps, self.state.train_seconds)

    def log(self, tag: str, value: float) -> None:
        """Write a scalar to TensorBoard (and MLflow / W&B when tracking is on) at the current env step."""
        self.logger.scalars({tag: float(value)}, self.state.env_steps)


class Callback:
    """Override the points you need; every default does nothing. Called in the order the callbacks were given:
    after the run's own at on_start (once its log is open), before_update, after_update (the non-finite guard's
    check) and on_end (the final checkpoint, the result lines); before them at after_collect and after_iteration
    (the schedules, then the test phase, logs and checkpoints come last there)."""

    def on_start(self, run: RunContext) -> None:
        """Before the first collect of this process (a resumed run starts again here), once the log is open."""

    def after_collect(self, run: RunContext, stats: CollectStats) -> StopRequest:
        """After a collect phase: `stats.steps` env steps, the episodes that finished in it."""
        return None

    def before_update(self, run: RunContext) -> None:
        """Before an update (not while an off-policy run acts at random before algo.learning_starts)."""

    def after_update(self, run: RunContext, metrics: Mapping[str, Any]) -> StopRequest:
        """After an update: its losses and diagnostics (tensors or floats; `float()` each one you read)."""
        return None

    def after_iteration(self, run: RunContext) -> StopRequest:
        """At the end of every iteration, updated or not, before the run's test phase, logs and checkpoint:
        `run.iteration` holds what it collected and learned."""
        return None

    def after_test(self, run: RunContext, result: TestStats) -> StopRequest:
        """After a test phase: `result.returns` and `result.lengths` per episode (run.state holds the means)."""
        return None

    def on_checkpoint(self, run: RunContext, path: Path) -> None:
        """After a checkpoint was written to `path` (periodic, on a stop, and the final one)."""

    def on_end(self, run: RunContext, reason: str) -> None:
        """After the final checkpoint: reason is budget, stop_reward, pruned, or a callback's stop reason."""


# Each point's arguments after `self`, as the trainer passes them.
POINTS = {"on_start": ("run",), "after_collect": ("run", "stats"), "before_update": ("run",),
          "after_update": ("run", "metrics"), "after_iteration": ("run",), "after_test": ("run", "result"),
          "on_checkpoint": ("run", "path"), "on_end": ("run", "reason")}


def check_points(callback: Callback) -> None:
    """A point overridden with other arguments than the trainer passes is a TypeError naming the signature, before
    the run starts (not a TypeError from deep inside the loop at the first call)."""
    import inspect

    for name, args in POINTS.items():
        if getattr(type(callback), name, None) is getattr(Callback, name):
            continue
        try:
            inspect.signature(getattr(callback, name)).bind(*args)
        except (TypeError, ValueError):
            raise TypeError(f"{type(callback).__name__}.{name} must take (self, {', '.join(args)}): the run calls "
                            f"{name}({', '.join(args)}) (see rlcli.Callback)") from None


class CallbackList:
    """The trainer's one way to call its callbacks: every point calls them all, and the first stop request wins."""

    def __init__(self, callbacks: Sequence[Callback] = ()) -> None:
        for callback in callbacks:
            if not isinstance(callback, Callback):
                raise TypeError(f"callbacks take rlcli.Callback instances, not {type(callback).__name__}; "
                                "subclass rlcli.Callback and override the points you need")
            check_points(callback)
        self.callbacks = list(callbacks)

    def on_start(self, run: RunContext) -> None:
        for callback in self.callbacks:
            callback.on_start(run)

    def after_collect(self, run: RunContext, stats: CollectStats) -> str | None:
        return _first_stop(callback.after_collect(run, stats) for callback in self.callbacks)

    def before_update(self, run: RunContext) -> None:
        for callback in self.callbacks:
            callback.before_update(run)

    def after_update(self, run: RunContext, metrics: Mapping[str, Any]) -> str | None:
        return _first_stop(callback.after_update(run, metrics) for callback in self.callbacks)

    def after_iteration(self, run: RunContext) -> str | None:
        """Each stop request is the iteration's at once (`run.iteration.stop`, the first wins), so that the
        callbacks after it (the stop line, the checkpoint) see it."""
        it = run.iteration
        assert it is not None
        for callback in self.callbacks:
            reason = _first_stop([callback.after_iteration(run)])
            it.stop = it.stop or reason
        return it.stop

    def after_test(self, run: RunContext, result: TestStats) -> str | None:
        return _first_stop(callback.after_test(run, result) for callback in self.callbacks)

    def on_checkpoint(self, run: RunContext, path: Path) -> None:
        for callback in self.callbacks:
            callback.on_checkpoint(run, path)

    def on_end(self, run: RunContext, reason: str) -> None:
        for callback in self.callbacks:
            callback.on_end(run, reason)


def _first_stop(requests: Any) -> str | None:
    """Every callback is called (each may log); the first that asked to stop names the reason."""
    reason = None
    for request in list(requests):
        if reason is None and request:
            reason = request if isinstance(request, str) else "stopped by a callback"
    return reason
