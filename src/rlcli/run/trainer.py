"""The training loop: collect, update, then the callbacks (test, video, log, stop, signal, checkpoint), on one clock.

The trainer owns every counter (`TrainState`); nothing else keeps its own step count. It runs over
the components that `build` made (build.py) and saves them through run/state.py. What follows an update is a list of
callbacks in a fixed order (builtin_callbacks.py); a user's callbacks (callbacks.py) are called at their points.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple, NoReturn

from rlcli.collectors.env_faults import CollectorError, EnvError
from rlcli.collectors.local import CollectStats
from rlcli.collectors.testing import TestStats
from rlcli.contracts import Learner, OnPolicyLearner, RunClock
from rlcli.envs import library_noise
from rlcli.run import lock as run_lock
from rlcli.run.budget import budget_warnings, planned_steps, said_by_the_sweep
from rlcli.run.build import Components
from rlcli.run.builtin_callbacks import Iteration, builtin_callbacks, crossed
from rlcli.run.callbacks import Callback, CallbackList, RunContext
from rlcli.run.divergence import Diverged, NonfiniteGuard
from rlcli.run.resume import already_done_line, change_notice
from rlcli.run.state import TrainState, drop_stale_best, save
from rlcli.run.stop import STOP_GRACE_SECONDS, RunFailed, StopNow, StoppedBySignal, StopSignals
from rlcli.schedules import apply_schedules
from rlcli.services import checkpoint
from rlcli.services.deadlines import DEADLINES
from rlcli.services.log import RunLogger, fmt_return, say
from rlcli.services.os_errors import describe_os_error, quiet_thread_os_errors
from rlcli.services.runtime import seconds_since_process_start
from rlcli.services.tracking import Tracking, run_files, start_for_run

logger = logging.getLogger("rlcli")


def learning_started(learner: Learner, env_steps: int) -> bool:
    """Off-policy runs act at random and learn nothing for their first algo.learning_starts env steps."""
    return isinstance(learner, OnPolicyLearner) or env_steps >= learner.algo.learning_starts


@dataclass
class TrainerOptions:
    """How a trainer is run, given once by whoever runs it (rl-train, a sweep job, the Python API)."""

    console: Literal["full", "lines", "off"] | None = None  # None: full when log.console, else off
    console_prefix: str = ""  # a sweep's job: "[job 3] " before each line
    env_label: str | None = None  # the header's name for the env (None: env.id)
    sweep_group: str | None = None  # a sweep's job: the sweep its tracked run is grouped under
    job_started: float | None = None  # a sweep's job: its perf_counter start (earlier jobs share the process)
    typed_keys: set[str] | None = None  # the command line's keys (None: unknown), for budget_warnings
    callbacks: Sequence[Callback] = ()  # called at the loop's points (callbacks.py): pruners, the user's own
    in_python: bool = False  # rlcli.train(): a failure is raised to the caller, not printed on stderr


class PlannedUpdate(NamedTuple):
    """What an iteration's update needs from the loop, and what a skipped update goes back to."""

    clock: RunClock
    snapshot: dict[str, Any] | None


class Trainer:
    log: RunLogger  # from start() on
    tracking: Tracking | None
    context: RunContext

    def __init__(self, components: Components, run_dir: Path, state: TrainState | None = None,
                 options: TrainerOptions | None = None) -> None:
        self.c, self.run_dir = components, run_dir
        self.state = state or TrainState()
        self.options = options or TrainerOptions()
        self.callbacks = CallbackList(self.options.callbacks)  # the user's, a pruner's, a sweep's
        self.steps = builtin_callbacks(self)  # the loop's own, after each update (builtin_callbacks.py)
        self.stop_reason: str | None = None  # budget, stop_reward, pruned or a callback's reason, once run ends
        # a single run's first Ctrl-C stops within seconds; a sweep's job waits for its safe point (see StopSignals)
        self.signals = StopSignals(grace=None if self.options.sweep_group is not None else STOP_GRACE_SECONDS)
        self.guard = NonfiniteGuard(components, run_dir)  # train.on_nonfinite
        self.saved_at: int | None = None  # env steps of the last checkpoint this process saved (None: none yet)

    # ------------------------------------------------------------------------------------- the loop
    def run(self) -> float:
        """Train until train.total_steps or the stop reward; return the last mean test return. A filesystem fault
        (a full or read-only disk, a file-size limit, the run dir deleted) is one line and exit code 1."""
        threading.excepthook = quiet_thread_os_errors
        try:
            return self._run()
        except OSError as error:
            self.close()
            self._fail(describe_os_error(error))
        except Diverged as error:  # the final checkpoint would have held non-finite weights
            self.close()
            self._fail(str(error))

    def _run(self) -> float:
        if self.already_done():
            return self.say_already_done()
        self.start()
        restore_signals = self.signals.catch()
        restore_deadlines = DEADLINES.install(self.c.settings.step_timeout)  # train.step_timeout, per env step
        try:
            while self.state.env_steps < self.c.settings.total_steps:
                it = self.collect()
                if not self.update(it):
                    continue  # rolled back to the last good checkpoint: collect again from there
                if self.after_update(it):
                    break
        except (EnvError, CollectorError, Diverged) as error:
            self.fail_run(self.describe_failure(error))
        except StopNow as stop:  # a second signal, or the first one's safe point too far away: now, no checkpoint
            stop.run_dir, good = str(self.run_dir), self._last_good()
            stop.checkpoint = "" if good is None else str(good.relative_to(self.run_dir))
            with contextlib.suppress(Exception):
                logger.info("%s", stop.line().removeprefix("rl-train: "))
            self.log.close(status="KILLED")
            self.close(terminate=True)  # a step it interrupted may still be running in a worker
            raise
        except BaseException:
            self.log.close(status="KILLED" if self.signals.received is not None else "FAILED")  # no-op if stopped
            raise
        finally:
            restore_deadlines()
            restore_signals()
        return self.finish()

    def after_update(self, it: Iteration, tested: TestStats | None = None) -> bool:
        """The built-in callbacks in their order (test, video, log, stop line, signal, checkpoint). True: stop.
        `tested`: this iteration's test episodes, when the caller ran them (a population's members, together)."""
        it.tested = tested
        return any(step.after_iteration(it) for step in self.steps)  # the first True ends the iteration

    def describe_failure(self, error: EnvError | CollectorError | Diverged) -> str:
        if isinstance(error, EnvError):
            return f"env {self.c.cfg.env.id} {error} at env step {self.state.env_steps + error.step:,}"
        return str(error)

    # ------------------------------------------------------------------------------- the loop's steps
    def start(self) -> None:
        """Before the first collect: warnings, tracking, the logger and its header, the clocks, the callbacks and
        the schedules' values for the first collect."""
        c, state = self.c, self.state
        state.finished = False
        run_lock.remove_stale_temporaries(self.run_dir)  # this process holds the run dir: none is in flight
        library_noise.log_pending()
        planned = planned_steps(c, state.env_steps)
        for warning in budget_warnings(c, planned, self.options.typed_keys):
            if not said_by_the_sweep():  # a -m sweep said it once for all its jobs
                say(f"rl-train: warning: {warning}")
            logger.info("warning: %s", warning)  # train.log only: the line above is the console's
        self.tracking = tracking = self._start_tracking()
        console = self.options.console or ("full" if c.cfg.log.console else "off")
        self.log = log = RunLogger(self.run_dir, c.settings.total_steps, console, bool(c.cfg.log.tensorboard),
                                   start_step=state.env_steps, start_seconds=state.train_seconds,
                                   prefix=self.options.console_prefix, tracking=tracking)
        log.message(f"rlcli: {c.cfg.algo.name} on {self.options.env_label or c.cfg.env.id}, {planned:,} {c.unit}, "
                    f"device {c.device}, run dir {self.run_dir}"
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
        self._restart_clock()
        started = self.options.job_started
        age = seconds_since_process_start() if started is None else self._started - started
        if age is not None:
            logger.info("start-up: the first env step comes %.2f s after the %s started", age,
                        "process" if started is None else "job")
        self.context = RunContext(self.run_dir, state, c.algo, c.cfg, log.scalars)
        self.callbacks.on_start(self.context)
        self._apply_schedules()

    def _apply_schedules(self) -> dict[str, float]:
        """Every scheduled value at the run's progress now. Once per iteration, right after its collect: the update
        learns with these values and the next collect acts with them (progress counts env steps only)."""
        return apply_schedules(self.c.schedules, RunClock(self.state.env_steps, self.c.settings.total_steps).progress)

    def _restart_clock(self) -> None:
        """SPS and train_seconds count from here (the start, or a rollback that rewound the counters)."""
        self._started, self._steps_at_start = time.perf_counter(), self.state.env_steps
        self._seconds_before_run = self.state.train_seconds

    def collect(self) -> Iteration:
        return self.after_collect(self.c.collector.collect(self.c.learner, random_actions=self.warming_up()))

    def warming_up(self) -> bool:
        """True while an off-policy run acts at random, before algo.learning_starts."""
        return not learning_started(self.c.learner, self.state.env_steps)

    def after_collect(self, stats: CollectStats) -> Iteration:
        """Count the collect phase's steps and episodes, the callbacks may ask to stop, then the schedules."""
        c, state = self.c, self.state
        it = Iteration(previous=state.env_steps, stats=stats)
        state.env_steps += stats.steps
        state.episodes += len(stats.episode_returns)
        c.recent_returns.extend(stats.episode_returns)
        c.recent_lengths.extend(stats.episode_lengths)
        it.stop = self.callbacks.after_collect(self.context, stats)
        it.scheduled = self._apply_schedules()
        return it

    def update(self, it: Iteration) -> bool:
        """One update (once learning starts), checked for non-finite values. False: rolled back, start over."""
        planned = self.before_update(it)
        metrics = None
        if planned is not None:
            with self.c.clock("update"):
                metrics = self.c.learner.update(planned.clock)
        return self.record_update(it, planned, metrics)

    def before_update(self, it: Iteration) -> PlannedUpdate | None:
        """The update's clock and the skip snapshot, when this iteration updates (None: it does not). The clock
        carries the transitions the collect phase stored (SB3's gradient_steps=-1 counts them)."""
        if not learning_started(self.c.learner, self.state.env_steps):
            return None
        run_clock = RunClock(self.state.env_steps, self.c.settings.total_steps, it.stats.transitions)
        return PlannedUpdate(run_clock, self.guard.snapshot())

    def record_update(self, it: Iteration, planned: PlannedUpdate | None, metrics: dict[str, Any] | None) -> bool:
        """Check the update's numbers and weights, count it, tell the callbacks. False: rolled back, start over."""
        s, state = self.c.settings, self.state
        if planned is not None:
            assert metrics is not None
            problem = self.guard.check(metrics, state.updates)
            if problem is not None:
                metrics = self.guard.handle(problem, planned.snapshot, state, self.log)  # stop, roll back or skip
                if metrics is None:
                    self._restart_clock()
                    self._apply_schedules()  # the next collect acts at the checkpoint's progress
                    return False
            it.metrics = {**metrics, **{f"schedule_{k}": v for k, v in it.scheduled.items()}}
            state.updates += 1
            it.stop = it.stop or self.callbacks.after_update(self.context, it.metrics)
        it.sps = (state.env_steps - self._steps_at_start) / (time.perf_counter() - self._started)
        it.last_phase = state.env_steps >= s.total_steps
        return True

    def test_due(self, it: Iteration) -> bool:
        """Whether this iteration ends with a test phase (known once `record_update` has run)."""
        every = self.c.settings.test_every
        return crossed(self.state.env_steps, it.previous, every) or (it.last_phase and every > 0)

    def stop_on_signal(self) -> None:
        """The safe point for Ctrl-C / SIGTERM: a checkpoint, one line, exit code 128 + the signal."""
        if self.signals.received is None:
            return
        self.signals.at_safe_point()
        self.save()
        name = signal.Signals(self.signals.received).name
        stopped = f"{name}: stopped at {self.state.env_steps:,} {self.c.unit} with a checkpoint saved; "
        sweep_dir = self.options.sweep_group
        if sweep_dir is None:
            stopped += f"resume with: rl-train resume={self.run_dir}"
        else:  # resuming this job alone would leave the sweep's other jobs (waiting, stopped) where they are
            stopped += (f"finish the sweep with the same command plus hydra.sweep.dir={sweep_dir} resume=auto "
                        f"(this job alone: rl-train resume={self.run_dir})")
        log = self.log
        log.message(stopped)
        if not log.show_console:  # log.console=false: stderr still says why the run ended, and how on
            say(f"rl-train: {stopped}")
        log.close(status="KILLED")
        self.close()
        raise StoppedBySignal(self.signals.received)

    def finish(self) -> float:
        """The final checkpoint, the result lines, the run's summary."""
        state, log = self.state, self.log
        self.stop_reason = self.stop_reason or "budget"
        state.finished = self.stop_reason in ("budget", "stop_reward")  # otherwise it can be resumed and finished
        final = self.save()
        sps = (state.env_steps - self._steps_at_start) / (time.perf_counter() - self._started)
        said = {"budget": "budget reached", "stop_reward": "stopped early"}.get(self.stop_reason, self.stop_reason)
        log.result(f"done: {state.env_steps:,} {self.c.unit} in {state.train_seconds:.1f} s ({sps:.0f} SPS), "
                   f"last test return {fmt_return(state.last_test_return)}, {said}")
        log.result(f"time: {self.c.clock.summary(top=8)}")
        # summary names of their own: a scalar tag at the final step would be a second point of that tag
        summary = {"final/test_return": state.last_test_return, "final/best_test_return": state.best_test_return,
                   "final/env_steps": state.env_steps, "final/train_seconds": state.train_seconds}
        log.close(summary={k: float(v) for k, v in summary.items() if v is not None},
                  files=run_files(self.run_dir, final, log.message) if self.tracking is not None else [])
        self.close()
        self.callbacks.on_end(self.context, self.stop_reason)
        return _as_return(state.last_test_return)

    def fail_run(self, message: str) -> NoReturn:
        self.log.close(status="FAILED")
        self.close(terminate=True)  # a step that timed out may still be running in an async env's worker
        self._fail(message)

    def say_already_done(self) -> float:
        state = self.state
        drop_stale_best(state, self.run_dir)  # nothing is written in this run: a later best.pt is dropped now
        self.close()
        self.stop_reason = "already finished"
        say(f"rl-train: {already_done_line(state, self.c.settings.total_steps, self.c.stop_reward)}")
        return _as_return(state.last_test_return)

    def _fail(self, message: str) -> NoReturn:
        """One line on stderr: what went wrong, and the last good checkpoint to resume from; exit code 1."""
        good = self._last_good()
        steps = checkpoint.checkpoint_steps(good) if good is not None else 0
        if good is not None:
            where = (f"the last good checkpoint is {good.relative_to(self.run_dir)} ({steps:,} {self.c.unit}): "
                     f"rl-train resume={self.run_dir}")
        elif not self.run_dir.is_dir():  # deleted (or moved) while training: its checkpoints went with it
            saved = f" (this run's last at {self.saved_at:,} {self.c.unit})" if self.saved_at is not None else ""
            where = (f"the run directory {self.run_dir} is gone, with every checkpoint it held{saved}: nothing is "
                     "left to resume from")
        else:
            where = "no checkpoint was saved before it (train.checkpoint_every sets how often one is)"
        with contextlib.suppress(Exception):
            logger.info("error: %s; %s", message, where)  # train.log; the console's line is below
        if not self.options.in_python:
            say(f"rl-train: error: {message}; {where}")
        raise RunFailed(f"{message}; {where}")

    def _last_good(self) -> Path | None:
        """The newest checkpoint that reads back whole (None: none, or the run dir cannot be read)."""
        try:
            return checkpoint.find_good(self.run_dir / "checkpoints", warn=lambda m: None)
        except OSError:
            return None

    def _start_tracking(self) -> Tracking | None:
        """MLflow / W&B runs for this run (the checkpoint's, when resuming); see tracking.start_for_run."""
        tracking = start_for_run(self.c.cfg, self.run_dir, self.state.env_steps, self.state.tracking,
                                 self.options.sweep_group, self.options.in_python, on_error=self.close)
        if tracking is not None:
            self.state.tracking = tracking.run_ids
        return tracking

    def close(self, terminate: bool = False) -> None:
        """Close the envs; `terminate`: async workers are ended, not waited for (a step may still be running)."""
        self.c.close(terminate)

    def already_done(self) -> bool:
        state = self.state
        if not state.finished:
            return False
        stop, last = self.c.stop_reward, state.last_test_return
        reached = stop is not None and last is not None and last >= stop
        return state.env_steps >= self.c.settings.total_steps or reached

    # ------------------------------------------------------------------------------- checkpoints
    def save(self) -> Path:
        if not self.run_dir.is_dir():  # deleted or moved while training: not silently re-made with checkpoints only
            raise FileNotFoundError(2, "No such file or directory", str(self.run_dir))
        self.guard.check_before_saving(self.state.env_steps)
        self.state.train_seconds = self._seconds_before_run + time.perf_counter() - self._started
        with self.c.clock("checkpoint"):
            path = save(self.c, self.state, self.run_dir)
            self.saved_at = self.state.env_steps
            drop_stale_best(self.state, self.run_dir)
        self.callbacks.on_checkpoint(self.context, path)
        return path


def _as_return(value: float | None) -> float:
    return float("nan") if value is None else value
