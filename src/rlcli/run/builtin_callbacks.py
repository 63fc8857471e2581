"""The run's own callbacks: `rlcli.Callback`s at the same points as a user's, in one explicit order.

`builtin_callbacks` lists them with the user's among them; the order matters at each point (see its docstring).
Each is made with what it needs (the components, the trainer's save) and reads the run through the `RunContext`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rlcli.contracts import OnPolicyLearner, RunClock
from rlcli.run.budget import budget_warnings, planned_steps, said_by_the_sweep
from rlcli.run.build import Components
from rlcli.run.callbacks import Callback, Iteration, RunContext, StopRequest
from rlcli.run.evaluation import record_video, test_phase
from rlcli.run.resume import change_notice
from rlcli.run.state import TrainState
from rlcli.schedules import apply_schedules
from rlcli.services.log import RunLogger, fmt_return, say
from rlcli.services.runtime import seconds_since_process_start
from rlcli.services.tracking import run_files, start_for_run

if TYPE_CHECKING:
    from rlcli.collectors.local import CollectStats
    from rlcli.collectors.testing import TestStats
    from rlcli.run.trainer import Trainer, TrainerOptions

__all__ = ["Iteration", "builtin_callbacks", "crossed", "schedules_now", "test_due"]

logger = logging.getLogger("rlcli")


def crossed(step: int, previous: int, every: int) -> bool:
    """True when the clock passed a multiple of `every` between `previous` and `step`."""
    return every > 0 and step // every > previous // every


def test_due(c: Components, state: TrainState, it: Iteration) -> bool:
    """Whether this iteration ends with a test phase: each test.every env steps, and at the budget's end."""
    every = c.settings.test_every
    return crossed(state.env_steps, it.previous, every) or (it.last_phase and every > 0)


def schedules_now(c: Components, state: TrainState) -> dict[str, float]:
    """Every scheduled value at the run's progress now (progress counts env steps only)."""
    return apply_schedules(c.schedules, RunClock(state.env_steps, c.settings.total_steps).progress)


class BudgetWarnings(Callback):
    """Before anything else: what a user should know about a budget that does not do what it says (budget.py), and
    what building or resuming the run found (`Components.notices`)."""

    def __init__(self, c: Components, typed_keys: set[str] | None) -> None:
        self.c, self.typed_keys = c, typed_keys

    def on_start(self, run: RunContext) -> None:
        for warning in budget_warnings(self.c, planned_steps(self.c, run.state.env_steps), self.typed_keys):
            if not said_by_the_sweep():  # a -m sweep said it once for all its jobs
                say(f"rl-train: warning: {warning}")
            logger.info("warning: %s", warning)  # train.log only: the line above is the console's
        for notice in self.c.notices:  # what building or resuming found (a resume whose envs were reset)
            say(f"rl-train: warning: {notice}")
            logger.info("warning: %s", notice)


class FinalCheckpoint(Callback):
    """The run's last checkpoint, first thing at its end (the log's result lines name it to the tracked runs)."""

    def __init__(self, save: Callable[[], Path]) -> None:
        self.save = save

    def on_end(self, run: RunContext, reason: str) -> None:
        self.save()


class RunLog(Callback):
    """The run's log from its start to its end. on_start: the tracked runs (MLflow / W&B) and the logger opened, the
    header line, a resume's changed settings, where the tracked runs are, then the clocks start. on_end: the result
    lines, the logs closed with the run's summary, then the envs closed (before the user's on_end)."""

    def __init__(self, c: Components, options: TrainerOptions, close: Callable[[], None]) -> None:
        self.c, self.options, self.close = c, options, close
        self.last_checkpoint: Path | None = None

    def on_start(self, run: RunContext) -> None:
        c, state, options = self.c, run.state, self.options
        tracking = start_for_run(c.cfg, run.run_dir, state.env_steps, state.tracking, options.sweep_group,
                                 options.in_python, on_error=self.close)
        if tracking is not None:
            state.tracking = tracking.run_ids
        console = options.console or ("full" if c.cfg.log.console else "off")
        run.logger = log = RunLogger(run.run_dir, c.settings.total_steps, console, bool(c.cfg.log.tensorboard),
                                     start_step=state.env_steps, start_seconds=state.train_seconds,
                                     prefix=options.console_prefix, tracking=tracking)
        log.message(f"rlcli: {options.algo_label or c.cfg.algo.name} on {options.env_label or c.cfg.env.id}, "
                    f"{planned_steps(c, state.env_steps):,} {c.unit}, device {c.device}, run dir {run.run_dir}"
                    + (f", {c.collector.describe()}" if c.collector.describe() else "")
                    + (f", resumed at {state.env_steps:,} {c.unit}" if state.env_steps else ""))
        if state.new_change is not None:  # a resume that changed settings on request (run/resume.py)
            notice = change_notice(state.new_change)
            say(f"rl-train: warning: {notice}")
            logger.info("warning: %s", notice)  # train.log: the run's history
            state.new_change = None
        for where in tracking.describe() if tracking is not None else []:
            log.message(f"tracking: {where}" + (" (continued)" if state.env_steps else ""))
        c.clock.restart()
        run._restart_clock()
        started = options.job_started
        age = seconds_since_process_start() if started is None else run._since[0] - started
        if age is not None:
            logger.info("start-up: the first env step comes %.2f s after the %s started", age,
                        "process" if started is None else "job")

    def on_checkpoint(self, run: RunContext, path: Path) -> None:
        self.last_checkpoint = path

    def on_end(self, run: RunContext, reason: str) -> None:
        state, log, sps = run.state, run.logger, run.sps
        said = {"budget": "budget reached", "stop_reward": "stopped early"}.get(reason, reason)
        log.result(f"done: {state.env_steps:,} {self.c.unit} in {state.train_seconds:.1f} s ({sps:.0f} SPS), "
                   f"last test return {fmt_return(state.last_test_return)}, {said}")
        log.result(f"time: {self.c.clock.summary(top=8)}")
        # summary names of their own: a scalar tag at the final step would be a second point of that tag
        summary = {"final/test_return": state.last_test_return, "final/best_test_return": state.best_test_return,
                   "final/env_steps": state.env_steps, "final/train_seconds": state.train_seconds}
        final = self.last_checkpoint
        files = run_files(run.run_dir, final, log.message) if log.tracking is not None and final is not None else []
        log.close(summary={k: float(v) for k, v in summary.items() if v is not None}, files=files)
        self.close()


class Schedules(Callback):
    """Every scheduled value at the run's progress: at the start, then once per iteration right after its collect
    (the update learns with these values and the next collect acts with them). After the user's callbacks."""

    def __init__(self, c: Components) -> None:
        self.c = c

    def on_start(self, run: RunContext) -> None:
        schedules_now(self.c, run.state)

    def after_collect(self, run: RunContext, stats: CollectStats) -> StopRequest:
        assert run.iteration is not None
        run.iteration.scheduled = schedules_now(self.c, run.state)
        return None


class TestPhase(Callback):
    """Test episodes every test.every env steps and at the budget's end (best.pt kept by test_phase); every
    callback's after_test sees them (`tell`); train.stop_reward reached ends the run after this iteration's logs."""

    def __init__(self, c: Components, tell: Callable[[RunContext, TestStats], str | None]) -> None:
        self.c, self.tell = c, tell

    def after_iteration(self, run: RunContext) -> StopRequest:
        c, state, it = self.c, run.state, run.iteration
        assert it is not None
        if not test_due(c, state, it):
            return None
        with c.clock("test"):
            result = test_phase(c, state, run.run_dir, run.logger, it.tested)
        requested = self.tell(run, result)
        last, stop_reward = state.last_test_return, c.stop_reward
        reached = stop_reward is not None and last is not None and last >= stop_reward
        it.stop = "stop_reward" if reached else it.stop or requested
        return None


class Video(Callback):
    """One recorded test episode each time log.video_every env steps pass."""

    def __init__(self, c: Components) -> None:
        self.c = c

    def after_iteration(self, run: RunContext) -> StopRequest:
        c, it = self.c, run.iteration
        assert it is not None
        if c.video_envs is not None and crossed(run.state.env_steps, it.previous, int(c.cfg.log.video_every)):
            with c.clock("test"):
                record_video(c, run.state.env_steps, run.run_dir, run.logger)
        return None


def tb_cadence(c: Components) -> int:
    """train.tb_every, or for auto: every update of an on-policy run (at most ~1000 points a run), ~300
    points for an off-policy run."""
    s = c.settings
    if isinstance(s.tb_every, int):
        return s.tb_every
    per_phase = c.steps_per_phase
    return max(per_phase, s.total_steps // (1000 if isinstance(c.learner, OnPolicyLearner) else 300))


class Logging(Callback):
    """TensorBoard points (and the tracked runs') at their cadence, console tables at theirs, the progress bar
    every iteration."""

    def __init__(self, c: Components) -> None:
        self.c, self.tb_every = c, tb_cadence(c)

    def after_iteration(self, run: RunContext) -> StopRequest:
        c, state, log, it = self.c, run.state, run.logger, run.iteration
        assert it is not None
        s, clock = c.settings, c.clock
        table_due = crossed(state.env_steps, it.previous, s.log_every) or it.last_phase or it.stop == "stop_reward"
        if table_due or crossed(state.env_steps, it.previous, self.tb_every):
            with clock("log"):
                scalars = {f"train/{k}": float(v) for k, v in it.metrics.items()}  # one sync per log
                scalars["time/sps"] = it.sps
                scalars.update(clock.scalars())
                scalars.update(it.stats.scalars)  # the collector's own (collector=ray: policy lag, restarts)
                if c.offline is None:  # an offline run plays no training episodes
                    scalars["rollout/episodes"] = state.episodes
                if c.recent_returns:
                    scalars["rollout/return_mean"] = float(np.mean(c.recent_returns))
                    scalars["rollout/ep_len_mean"] = float(np.mean(c.recent_lengths))
                log.scalars(scalars, state.env_steps)
                if table_due:
                    log.table(state.env_steps)
        with clock("log"):
            log.progress(state.env_steps, it.sps, state.last_test_return, clock)
        return None


class StopMessage(Callback):
    """A run that ends before its budget (stop reward, pruned, a callback's request) says why and how to go on."""

    def __init__(self, c: Components) -> None:
        self.c = c

    def after_iteration(self, run: RunContext) -> StopRequest:
        it = run.iteration
        assert it is not None
        if it.ends_early:  # at the budget's end it is simply the end
            run.logger.message(stop_line(it.stop or "", run.state, self.c.stop_reward, run.run_dir,
                                         str(self.c.cfg.env.id), self.c.unit))
        return None


class SignalSafePoint(Callback):
    """Ctrl-C / SIGTERM are acted on here, unless the run ends at this iteration anyway: a checkpoint, one line,
    StoppedBySignal (Trainer.stop_on_signal)."""

    def __init__(self, stop_on_signal: Callable[[], None]) -> None:
        self.stop_on_signal = stop_on_signal

    def after_iteration(self, run: RunContext) -> StopRequest:
        assert run.iteration is not None
        if not run.iteration.ends_early:
            self.stop_on_signal()
        return None


class Checkpoints(Callback):
    """A checkpoint each train.checkpoint_every env steps before the budget's end (the final one is
    FinalCheckpoint's), then the tracked runs flushed, so that they hold at least what the checkpoint holds."""

    def __init__(self, c: Components, save: Callable[[], Path]) -> None:
        self.c, self.save = c, save

    def after_iteration(self, run: RunContext) -> StopRequest:
        it, steps, s = run.iteration, run.state.env_steps, self.c.settings
        assert it is not None
        if not it.ends_early and crossed(steps, it.previous, s.checkpoint_every) and steps < s.total_steps:
            self.save()
            if run.logger.tracking is not None:
                run.logger.tracking.flush()
        return None


def builtin_callbacks(trainer: Trainer, users: Sequence[Callback]) -> list[Callback]:
    """The run's callbacks with the user's among them. The order matters: at on_start the warnings come before the
    header and the user's after the log opened, the schedules last; the guard sees an update first; at the end of an
    iteration the user's come first, the log sees the test's return and stop, a stop leaves before the signal's
    checkpoint, a signal's checkpoint replaces the cadence's; at the end the final checkpoint, then the result lines,
    then the user's on_end."""
    c = trainer.c
    return [BudgetWarnings(c, trainer.options.typed_keys), FinalCheckpoint(trainer.save),
            RunLog(c, trainer.options, trainer.close), trainer.guard, *users, Schedules(c),
            TestPhase(c, lambda run, result: trainer.callbacks.after_test(run, result)), Video(c), Logging(c),
            StopMessage(c), SignalSafePoint(trainer.stop_on_signal), Checkpoints(c, trainer.save)]


def stop_line(reason: str, state: TrainState, stop_reward: float | None, run_dir: Path, env_id: str = "",
              unit: str = "env steps") -> str:
    """The console's line for a run that ends before its budget: why, and how to go on where that makes sense (a run
    on a Python function's env goes on only from Python, with that function: rl-train cannot make its env)."""
    last = fmt_return(state.last_test_return)
    if reason == "stop_reward":
        return f"test return {last} >= stop reward {stop_reward}: stopping at {state.env_steps:,} {unit}"
    if reason == "pruned":
        return f"pruned at {state.env_steps:,} {unit} (test return {last}): the sweeper judged this trial hopeless"
    from rlcli.envs import PYTHON_ENV_PREFIX, python_env_function

    go_on = f"rl-train resume={run_dir}"
    if env_id.startswith(PYTHON_ENV_PREFIX):
        go_on = f"rlcli.train(resume={str(run_dir)!r}, env={python_env_function(env_id)})"
    return (f"stopped by a callback ({reason}) at {state.env_steps:,} {unit} (test return {last}); "
            f"continue it with: {go_on}")
