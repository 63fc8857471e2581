"""The training loop: collect, update, then the callbacks, on one clock.

The trainer owns every counter (`TrainState`); nothing else keeps its own step count. It runs over the components
that `build` made (build.py) and saves them through run/state.py. Everything else a run does (its budget warnings and
header, the non-finite guard, the schedules, the test phase and best model, video, logs, tracking, the stop line, the
signal's safe point, the checkpoints and the final one) is an `rlcli.Callback` at the same points as a user's, in
one list (builtin_callbacks.py).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
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
from rlcli.run.build import Components
from rlcli.run.builtin_callbacks import Iteration, builtin_callbacks, schedules_now, test_due
from rlcli.run.callbacks import Callback, CallbackList, RunContext
from rlcli.run.divergence import Diverged, NonfiniteGuard, RolledBack
from rlcli.run.resume import already_done_line, budget_passed
from rlcli.run.state import TrainState, drop_stale_best, save
from rlcli.run.stop import STOP_GRACE_SECONDS, RunFailed, StopNow, StoppedBySignal, StopSignals
from rlcli.services import checkpoint
from rlcli.services.deadlines import DEADLINES
from rlcli.services.log import RunLogger, say
from rlcli.services.os_errors import describe_os_error, quiet_thread_os_errors

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
    algo_label: str | None = None  # the header's name for the algorithm (None: algo.name; ippo's is ppo)
    sweep_group: str | None = None  # a sweep's job: the sweep its tracked run is grouped under
    job_started: float | None = None  # a sweep's job: its perf_counter start (earlier jobs share the process)
    typed_keys: set[str] | None = None  # the command line's keys (None: unknown), for budget_warnings
    callbacks: Sequence[Callback] = ()  # called at the loop's points (callbacks.py): pruners, the user's own
    in_python: bool = False  # rlcli.train(): a failure is raised to the caller, not printed on stderr


def header_labels(cfg: Any, choices: Any) -> dict[str, str | None]:
    """The run header's names where the config chosen is not the name it runs under (Hydra's runtime choices):
    algo=ippo runs ppo, env=MountainCarSparse-v0 is MountainCar-v0 with a setting."""
    algo, env = str(choices.get("algo", cfg.algo.name)), str(choices.get("env", "gym"))
    groups = cfg.algo.get("groups") or {}
    others = [f"{group}: {changes['name']}" for group, changes in groups.items()  # algo.groups.<group>.name
              if hasattr(changes, "get") and changes.get("name") not in (None, cfg.algo.name)]
    runs = "; ".join([cfg.algo.name, *others])
    return {"algo_label": f"{algo} ({runs})" if algo != cfg.algo.name or others else None,
            "env_label": f"{env} ({cfg.env.id})" if env not in ("gym", cfg.env.id) else None}


class PlannedUpdate(NamedTuple):
    """What an iteration's update needs from the loop."""

    clock: RunClock


class Trainer:
    def __init__(self, components: Components, run_dir: Path, state: TrainState | None = None,
                 options: TrainerOptions | None = None) -> None:
        self.c, self.run_dir = components, run_dir
        self.state = state or TrainState()
        self.options = options or TrainerOptions()
        self.guard = NonfiniteGuard(components, run_dir)  # train.on_nonfinite
        users = CallbackList(self.options.callbacks).callbacks  # checked: the user's, a pruner's, a sweep's
        self.callbacks = CallbackList(builtin_callbacks(self, users))  # the run's own with them, in order
        self.context = RunContext(run_dir, self.state, components.algo, components.cfg)
        self.stop_reason: str | None = None  # budget, stop_reward, pruned or a callback's reason, once run ends
        # a single run's first Ctrl-C stops within seconds; a sweep's job waits for its safe point (see StopSignals)
        self.signals = StopSignals(grace=None if self.options.sweep_group is not None else STOP_GRACE_SECONDS)
        self.saved_at: int | None = None  # env steps of the last checkpoint this process saved (None: none yet)

    @property
    def log(self) -> RunLogger:
        """The run's logger (opened at on_start by the RunLog callback)."""
        return self.context.logger

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
                it = self.after_collect(self.c.collector.collect(self.c.learner, random_actions=self.warming_up()))
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

    # ------------------------------------------------------------------------------- the loop's steps
    def start(self) -> None:
        """Before the first collect: the callbacks' on_start (the budget warnings, the log and its header, the
        clocks, the user's, the schedules' values for the first collect)."""
        self.state.finished = False
        run_lock.remove_stale_temporaries(self.run_dir)  # this process holds the run dir: none is in flight
        library_noise.log_pending()
        self.callbacks.on_start(self.context)

    def warming_up(self) -> bool:
        """True while an off-policy run acts at random, before algo.learning_starts."""
        return not learning_started(self.c.learner, self.state.env_steps)

    def after_collect(self, stats: CollectStats) -> Iteration:
        """Count the collect phase's steps and episodes, then its callbacks (the user's may ask to stop; the
        schedules' values for this iteration come last)."""
        c, state = self.c, self.state
        self.context.iteration = it = Iteration(previous=state.env_steps, stats=stats)
        state.env_steps += stats.steps
        state.episodes += len(stats.episode_returns)
        c.recent_returns.extend(stats.episode_returns)
        c.recent_lengths.extend(stats.episode_lengths)
        it.stop = self.callbacks.after_collect(self.context, stats)
        return it

    def update(self, it: Iteration) -> bool:
        """One update (once learning starts), then its callbacks. False: rolled back, start over."""
        planned = self.before_update(it)
        metrics = None
        if planned is not None:
            with self.c.clock("update"):
                metrics = self.c.learner.update(planned.clock)
        return self.record_update(it, planned, metrics)

    def before_update(self, it: Iteration) -> PlannedUpdate | None:
        """The update's clock when this iteration updates (None: it does not), after the callbacks' before_update
        (the guard's snapshot). The clock carries the transitions the collect phase stored (SB3's
        gradient_steps=-1 counts them)."""
        if not learning_started(self.c.learner, self.state.env_steps):
            return None
        self.callbacks.before_update(self.context)
        return PlannedUpdate(RunClock(self.state.env_steps, self.c.settings.total_steps, it.stats.transitions))

    def record_update(self, it: Iteration, planned: PlannedUpdate | None, metrics: dict[str, Any] | None) -> bool:
        """Count the update and tell the callbacks (the guard first). False: rolled back, start over."""
        state = self.state
        if planned is not None:
            assert metrics is not None
            it.metrics = {**metrics, **{f"schedule_{k}": v for k, v in it.scheduled.items()}}
            state.updates += 1
            try:
                it.stop = it.stop or self.callbacks.after_update(self.context, it.metrics)
            except RolledBack:
                self.context._restart_clock()
                schedules_now(self.c, state)  # the next collect acts at the checkpoint's progress
                return False
        it.sps = self.context.sps
        it.last_phase = state.env_steps >= self.c.settings.total_steps
        return True

    def test_due(self, it: Iteration) -> bool:
        """Whether this iteration ends with a test phase (known once `record_update` has run)."""
        return test_due(self.c, self.state, it)

    def after_update(self, it: Iteration, tested: TestStats | None = None) -> bool:
        """The callbacks at the iteration's end (the user's, then test, video, log, stop line, signal, checkpoint).
        True: the run stops here, before its budget. `tested`: this iteration's test episodes, when the caller ran
        them (a population's members, together)."""
        it.tested = tested
        self.callbacks.after_iteration(self.context)
        if it.ends_early:
            self.stop_reason = it.stop
        return it.ends_early

    def describe_failure(self, error: EnvError | CollectorError | Diverged) -> str:
        if isinstance(error, EnvError):
            return f"env {self.c.cfg.env.id} {error} at env step {self.state.env_steps + error.step:,}"
        return str(error)

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
        """The run's end: the callbacks' on_end (the final checkpoint, the result lines and the logs closed, the envs
        closed, then the user's)."""
        self.stop_reason = self.stop_reason or "budget"
        self.state.finished = self.stop_reason in ("budget", "stop_reward")  # otherwise it can be resumed and finished
        self.callbacks.on_end(self.context, self.stop_reason)
        return _as_return(self.state.last_test_return)

    def fail_run(self, message: str) -> NoReturn:
        self.log.close(status="FAILED")
        self.close(terminate=True)  # a step that timed out may still be running in an async env's worker
        self._fail(message)

    def say_already_done(self) -> float:
        state = self.state
        if state.finished:  # nothing is written in this run: a later best.pt is dropped now (a stopped run's stays)
            drop_stale_best(state, self.run_dir)
        self.close()
        self.stop_reason = "already finished"
        python = self.options.in_python  # rlcli.train(resume=..., more_steps=n) trains on from where the run is
        line = already_done_line(state, self.c.settings.total_steps, self.c.stop_reward, python)
        say(f"{'rlcli.train' if python else 'rl-train'}: {line}")
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

    def close(self, terminate: bool = False) -> None:
        """Close the envs; `terminate`: async workers are ended, not waited for (a step may still be running)."""
        self.c.close(terminate)

    def already_done(self) -> bool:
        state = self.state
        if not state.finished:  # a stopped run resumed with a lower budget it has already passed trains nothing
            return budget_passed(state, self.c.settings.total_steps)
        stop, last = self.c.stop_reward, state.last_test_return
        reached = stop is not None and last is not None and last >= stop
        return state.env_steps >= self.c.settings.total_steps or reached

    # ------------------------------------------------------------------------------- checkpoints
    def save(self) -> Path:
        if not self.run_dir.is_dir():  # deleted or moved while training: not silently re-made with checkpoints only
            raise FileNotFoundError(2, "No such file or directory", str(self.run_dir))
        self.guard.check_before_saving(self.state.env_steps)
        self.state.train_seconds = self.context.train_seconds
        with self.c.clock("checkpoint"):
            path = save(self.c, self.state, self.run_dir)
            self.saved_at = self.state.env_steps
            drop_stale_best(self.state, self.run_dir)
        self.callbacks.on_checkpoint(self.context, path)
        return path


def _as_return(value: float | None) -> float:
    return float("nan") if value is None else value
