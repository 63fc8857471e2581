"""What a run does when an update goes non-finite (`train.on_nonfinite`): stop, skip the update, or roll back.

The check itself (finite.py) is one host sync per update; this module decides what follows, so that a diverging
run never trains on NaN to the end of its budget nor writes a non-finite checkpoint over a good one. The guard is the
first of the run's callbacks at before_update (its snapshot) and after_update (its check), so that a user's callback
sees an update only once it stands.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlcli.run.build import Components
from rlcli.run.callbacks import Callback, RunContext, StopRequest
from rlcli.run.finite import check_update
from rlcli.run.resume import describe_change
from rlcli.run.state import TrainState, restore
from rlcli.services import checkpoint
from rlcli.services.log import RunLogger


class Diverged(RuntimeError):
    """A non-finite update that train.on_nonfinite does not let the run go past; the message is one line."""


class RolledBack(Exception):
    """The update went non-finite and the run went back to its last good checkpoint: the iteration is dropped and
    the loop collects again from there (the trainer catches it)."""


class NonfiniteGuard(Callback):
    """Checks each update and acts on train.on_nonfinite, at most train.max_nonfinite times in this process."""

    def __init__(self, components: Components, run_dir: Path) -> None:
        self.c, self.run_dir = components, run_dir
        self.events = 0  # non-finite updates met by this process
        self.snapshot: dict[str, Any] | None = None  # what a skipped update goes back to

    def before_update(self, run: RunContext) -> None:
        """on_nonfinite=skip only: a copy of the algorithm's state, for the update to go back to."""
        self.snapshot = copy.deepcopy(self.c.algo.state_dict()) if self.c.settings.on_nonfinite == "skip" else None

    def after_update(self, run: RunContext, metrics: Mapping[str, Any]) -> StopRequest:
        """The update checked (it is counted in run.state.updates already): stop raises Diverged, rollback raises
        RolledBack, skip puts the weights back and the update's metrics become `nonfinite_events` (the later
        callbacks and the logs see that)."""
        it = run.iteration
        assert it is not None
        scheduled = {f"schedule_{k}" for k in it.scheduled}
        problem = self.check({k: v for k, v in metrics.items() if k not in scheduled}, run.state.updates - 1)
        if problem is None:
            return None
        replaced = self.handle(problem, self.snapshot, run.state, run.logger)
        if replaced is None:
            raise RolledBack
        kept = {k: v for k, v in it.metrics.items() if k in scheduled}
        it.metrics.clear()
        it.metrics.update({**replaced, **kept})
        return None

    def weights(self) -> list[Any]:
        networks = self.c.algo.networks
        return [*networks.parameters(), *networks.buffers()]

    def check(self, metrics: Mapping[str, Any], updates: int) -> str | None:
        """What went non-finite in this update, or None. The weights are read every update of an on-policy run or
        with on_nonfinite=skip (its snapshot must be finite), else every 8th (~0.3 ms for SAC's 340k parameters,
        2-3% of a one-step update): a non-finite weight shows in the next update's losses anyway, and every
        checkpoint checks them all. `updates`: the updates before this one."""
        s = self.c.settings
        due = self.c.spec.on_policy or s.on_nonfinite == "skip" or updates % 8 == 0
        return check_update(metrics, self.weights() if due else [])

    def check_before_saving(self, env_steps: int) -> None:
        """Never write over, nor prune, a good checkpoint with non-finite weights."""
        problem = check_update({}, self.weights())
        if problem is not None:
            raise Diverged(f"{problem} at {env_steps:,} env steps: not saved")

    def handle(self, problem: str, snapshot: dict[str, Any] | None, state: TrainState,
               log: RunLogger) -> dict[str, Any] | None:
        """stop (raise Diverged), skip (put the weights back as they were before the update: the metrics to log)
        or rollback (load the last good checkpoint into the components and `state`: None)."""
        s = self.c.settings
        self.events += 1
        what = f"{problem} after the update at {state.env_steps:,} env steps"
        if s.on_nonfinite == "stop" or self.events > s.max_nonfinite:
            limit = "" if s.on_nonfinite == "stop" else \
                f" ({self.events} times, more than train.max_nonfinite={s.max_nonfinite})"
            raise Diverged(f"{what}{limit}: stopped without saving it ({rescue_hint(self.c, state)})")
        if s.on_nonfinite == "skip":
            assert snapshot is not None
            self.c.algo.load_state_dict(snapshot)
            log.message(f"warning: {what}: the update was undone (skip {self.events} of at most "
                        f"{s.max_nonfinite})")
            return {"nonfinite_events": float(self.events)}
        good = checkpoint.find_good(self.run_dir / "checkpoints", warn=log.message)
        if good is None:
            raise Diverged(f"{what}: nothing to roll back to")
        restored = restore(self.c, good)
        restored.stale_best = restored.stale_best or state.stale_best
        vars(state).update(vars(restored))
        log.rewind(state.env_steps)
        log.message(f"warning: {what}: rolled back to {good.name} ({state.env_steps:,} env steps; rollback "
                    f"{self.events} of at most {s.max_nonfinite})")
        return None


def rescue_hint(components: Components, state: TrainState) -> str:
    """How to go on past a divergence: a resume may lower the learning rate when it is given on the resume command
    line (run/resume.py); the run then goes on, but is no longer an exact continuation. Names the changes that
    earlier resumes of this run made."""
    cfg = components.cfg
    schedules = cfg.algo.get("schedules") or {}
    if "lr" in schedules:
        hint = (f"to go on with lower learning rates, add algo.schedules.lr=<schedule> (now {schedules['lr']}) to the "
                "resume command below: the run then goes on, but not as an exact continuation")
    elif components.algo.optimizers() and isinstance(cfg.algo.get("lr"), (int, float)):
        hint = (f"to go on with a lower learning rate, add algo.lr={float(cfg.algo.lr) / 2:.3g} (now "
                f"{float(cfg.algo.lr):.3g}) to the resume command below: the run then goes on, but not as an exact "
                "continuation")
    else:
        hint = "a lower learning rate or a gradient clip may help"
    if state.changes:
        hint += f"; earlier resumes changed {'; '.join(describe_change(r) for r in state.changes)}"
    return hint
