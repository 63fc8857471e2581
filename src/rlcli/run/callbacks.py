"""The loop's points where code from outside the loop runs: a sweeper's pruner, a Python user's own function.

The trainer calls each `Callback` at six points of every run. A callback reads the run through a
`RunContext` (its directory, its counters, the algorithm and its networks, the config) and can log
scalars beside the run's own. Returning True, or a short reason string, from `after_collect`,
`after_update` or `after_test` asks the run to stop at the end of that iteration: it is then saved
as a Ctrl-C would save it, not marked finished, so `resume=` continues it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from rlcli.collectors.local import CollectStats
    from rlcli.collectors.testing import TestStats
    from rlcli.run.state import TrainState

# What an after_* method returns: None/False to go on, True or a reason ("pruned", "plateau") to stop cleanly.
StopRequest = bool | str | None


@dataclass
class RunContext:
    """What a callback sees of the run it is called from; the same object at every point of one run."""

    run_dir: Path
    state: TrainState  # env_steps, updates, episodes, tests, last_test_return, best_test_return, ...
    algo: Any  # the algorithm: `algo.networks` holds its torch modules (and the observation normalizer)
    config: DictConfig
    _log_scalars: Callable[[dict[str, float], int], None]

    @property
    def env_steps(self) -> int:
        return self.state.env_steps

    def log(self, tag: str, value: float) -> None:
        """Write a scalar to TensorBoard (and MLflow / W&B when tracking is on) at the current env step."""
        self._log_scalars({tag: float(value)}, self.state.env_steps)


class Callback:
    """Override the points you need; every default does nothing. Called in the order the callbacks were given."""

    def on_start(self, run: RunContext) -> None:
        """Before the first collect of this process (a resumed run starts again here)."""

    def after_collect(self, run: RunContext, stats: CollectStats) -> StopRequest:
        """After a collect phase: `stats.steps` env steps, the episodes that finished in it."""
        return None

    def after_update(self, run: RunContext, metrics: Mapping[str, Any]) -> StopRequest:
        """After an update: its losses and diagnostics (tensors or floats; `float()` each one you read)."""
        return None

    def after_test(self, run: RunContext, result: TestStats) -> StopRequest:
        """After a test phase: `result.returns` and `result.lengths` per episode (run.state holds the means)."""
        return None

    def on_checkpoint(self, run: RunContext, path: Path) -> None:
        """After a checkpoint was written to `path` (periodic, on a stop, and the final one)."""

    def on_end(self, run: RunContext, reason: str) -> None:
        """After the final checkpoint: reason is budget, stop_reward, pruned, or a callback's stop reason."""


# Each point's arguments after `self`, as the trainer passes them.
POINTS = {"on_start": ("run",), "after_collect": ("run", "stats"), "after_update": ("run", "metrics"),
          "after_test": ("run", "result"), "on_checkpoint": ("run", "path"), "on_end": ("run", "reason")}


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

    def after_update(self, run: RunContext, metrics: Mapping[str, Any]) -> str | None:
        return _first_stop(callback.after_update(run, metrics) for callback in self.callbacks)

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
