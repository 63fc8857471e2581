"""The training loop: collect -> update -> test -> log -> checkpoint, on one clock.

The trainer owns every counter (`TrainState`); nothing else keeps its own step count. It runs over
the components that `build` made (build.py) and saves them through run_state.py.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, NoReturn

import numpy as np

from rlcli import checkpoint
from rlcli.build import Components
from rlcli.collector import CollectorError, EnvError, evaluate
from rlcli.contracts import RunClock
from rlcli.envs import library_noise
from rlcli.finite import check_update
from rlcli.log import RunLogger, fmt_return
from rlcli.os_errors import describe_os_error
from rlcli.registry import ConfigError
from rlcli.run_state import TrainState, drop_stale_best, restore, save, save_best
from rlcli.runtime import seconds_since_process_start
from rlcli.schedules import apply_schedules
from rlcli.stop import StopNow
from rlcli.tracking import Tracking, run_files, settings_of

logger = logging.getLogger("rlcli")


class RunFailed(SystemExit):
    """The run stopped on a fault it cannot go past; `message` is the line printed on stderr. Exit code 1."""

    def __init__(self, message: str) -> None:
        super().__init__(1)
        self.message = message


class Diverged(RuntimeError):
    """A non-finite update that train.on_nonfinite does not let the run go past; the message is one line."""


def _quiet_thread_os_errors(args: threading.ExceptHookArgs) -> None:
    """TensorBoard's writer thread meets the same disk fault as the loop, which reports it in one line: the thread's
    traceback goes to train.log only."""
    if isinstance(args.exc_value, OSError):
        logger.info("a background writer stopped: %s", args.exc_value)
        return
    threading.__excepthook__(args)


def remove_stale_temporaries(run_dir: Path) -> None:
    """`*.tmp` files that a killed process left behind (a write is a temporary file, then a rename)."""
    for stale in [*run_dir.glob("*.tmp"), *run_dir.glob("checkpoints/*.tmp")]:
        with contextlib.suppress(OSError):
            stale.unlink()


def checkpoint_steps(path: Path) -> int:
    return int(path.stem.split("_")[-1]) if path.stem.startswith("ckpt_") else 0


def crossed(step: int, previous: int, every: int) -> bool:
    """True when the clock passed a multiple of `every` between `previous` and `step`."""
    return every > 0 and step // every > previous // every


class Trainer:
    def __init__(self, components: Components, run_dir: Path, state: TrainState | None = None) -> None:
        self.c, self.run_dir = components, run_dir
        self.state = state or TrainState()
        self._stop_signal: int | None = None
        # Set by whoever runs the trainer: sweeps print one line per event instead of progress bars,
        # and an Optuna trial gets each test result (`after_test` returns True to stop: pruned).
        self.console_mode: Literal["full", "lines", "off"] = "full" if components.cfg.log.console else "off"
        self.console_prefix = ""
        self.env_label = str(components.cfg.env.id)  # the header's name for the env
        self.after_test: Callable[[TrainState], bool] | None = None
        self.stop_reason: Literal["budget", "stop_reward", "pruned"] | None = None
        self.sweep_group: str | None = None  # a sweep's job: the sweep its tracked run is grouped under
        self.job_started: float | None = None  # a sweep's job: its perf_counter start (earlier jobs share the process)
        self.typed_keys: set[str] | None = None  # the command line's keys (None: unknown), for budget_warnings
        self._nonfinite_events = 0  # non-finite updates met by this process (train.on_nonfinite)
        self._rolled_back = False

    # ------------------------------------------------------------------------------------- the loop
    def run(self) -> float:
        """Train until train.total_steps or the stop reward; return the last mean test return. A filesystem fault
        (a full or read-only disk, a file-size limit, the run dir deleted) is one line and exit code 1."""
        threading.excepthook = _quiet_thread_os_errors
        try:
            return self._run()
        except OSError as error:
            self.close()
            self._fail(describe_os_error(error))
        except Diverged as error:  # the final checkpoint would have held non-finite weights
            self.close()
            self._fail(str(error))

    def _run(self) -> float:
        c, s, state = self.c, self.c.settings, self.state
        algo, spec = c.algo, c.spec
        if self._already_done():
            drop_stale_best(state, self.run_dir)  # nothing is written in this run: a later best.pt is dropped now
            self.close()
            print(f"rl-train: this run already finished at {state.env_steps:,} env steps "
                  f"(test return {fmt_return(state.last_test_return)}); raise train.total_steps to train longer",
                  file=sys.stderr)
            return _as_return(state.last_test_return)
        state.finished = False
        remove_stale_temporaries(self.run_dir)  # this process holds the run dir (run_lock.py): none is in flight
        library_noise.log_pending()
        planned = self._planned_steps()
        for warning in budget_warnings(c, planned, self.typed_keys):
            print(f"rl-train: warning: {warning}", file=sys.stderr)
            logger.info("warning: %s", warning)  # train.log only: the line above is the console's
        tracking = self._start_tracking()
        log = RunLogger(self.run_dir, s.total_steps, self.console_mode, bool(c.cfg.log.tensorboard),
                        start_step=state.env_steps, start_seconds=state.train_seconds, prefix=self.console_prefix,
                        tracking=tracking)
        log.message(f"rlcli: {c.cfg.algo.name} on {self.env_label}, {planned:,} env steps, "
                    f"device {c.device}, run dir {self.run_dir}"
                    + (f", {c.collector.describe()}" if c.collector.describe() else "")
                    + (f", resumed at {state.env_steps:,} env steps" if state.env_steps else ""))
        for where in tracking.describe() if tracking is not None else []:
            log.message(f"tracking: {where}" + (" (continued)" if state.env_steps else ""))
        tb_every = self._tb_cadence()
        restore_signals = self._catch_stop_signals()
        clock = c.clock
        clock.restart()
        start, start_steps, stopped_early = time.perf_counter(), state.env_steps, False
        age = seconds_since_process_start() if self.job_started is None else start - self.job_started
        if age is not None:
            logger.info("start-up: the first env step comes %.2f s after the %s started", age,
                        "process" if self.job_started is None else "job")
        self._seconds_before_run = state.train_seconds
        try:
            while state.env_steps < s.total_steps:
                # collect
                warming_up = not spec.on_policy and state.env_steps < algo.learning_starts
                apply_schedules(c.schedules, RunClock(state.env_steps, s.total_steps).progress)  # acting values
                stats = c.collector.collect(algo, c.buffer, random_actions=warming_up)
                previous = state.env_steps
                state.env_steps += stats.steps
                state.episodes += len(stats.episode_returns)
                c.recent_returns.extend(stats.episode_returns)
                c.recent_lengths.extend(stats.episode_lengths)
                # update
                metrics: dict[str, Any] = {}
                if spec.on_policy or state.env_steps >= algo.learning_starts:
                    run_clock = RunClock(state.env_steps, s.total_steps)
                    scheduled = apply_schedules(c.schedules, run_clock.progress)  # learning values
                    snapshot = copy.deepcopy(algo.state_dict()) if s.on_nonfinite == "skip" else None
                    with clock("update"):
                        metrics = algo.update(c.buffer, run_clock)
                    problem = check_update(metrics, self._weights() if self._weights_due(state.updates) else [])
                    if problem is not None:
                        metrics = self._on_nonfinite(problem, snapshot, log)  # stops, rolls back or skips
                        if self._rolled_back:
                            self._rolled_back = False
                            start, start_steps = time.perf_counter(), state.env_steps
                            self._seconds_before_run = state.train_seconds
                            continue
                    metrics.update({f"schedule_{k}": v for k, v in scheduled.items()})
                    state.updates += 1
                sps = (state.env_steps - start_steps) / (time.perf_counter() - start)
                # test
                last_phase = state.env_steps >= s.total_steps
                reached = pruned = False
                if crossed(state.env_steps, previous, s.test_every) or (last_phase and s.test_every > 0):
                    with clock("test"):
                        self._test(log)
                    last = state.last_test_return
                    reached = c.stop_reward is not None and last is not None and last >= c.stop_reward
                    pruned = not reached and self.after_test is not None and self.after_test(state)
                if c.video_envs is not None and crossed(state.env_steps, previous, int(c.cfg.log.video_every)):
                    with clock("test"):  # a test episode, recorded
                        self._record_video(log)
                # log: TensorBoard points at their cadence, console tables at theirs
                table_due = crossed(state.env_steps, previous, s.log_every) or last_phase or reached
                if table_due or crossed(state.env_steps, previous, tb_every):
                    with clock("log"):
                        scalars = {f"train/{k}": float(v) for k, v in metrics.items()}  # one sync per log
                        scalars["time/sps"] = sps
                        scalars.update(clock.scalars())
                        scalars.update(stats.scalars)  # the collector's own (collector=ray: policy lag, restarts)
                        scalars["rollout/episodes"] = state.episodes
                        if c.recent_returns:
                            scalars["rollout/return_mean"] = float(np.mean(c.recent_returns))
                            scalars["rollout/ep_len_mean"] = float(np.mean(c.recent_lengths))
                        log.scalars(scalars, state.env_steps)
                        if table_due:
                            log.table(state.env_steps)
                with clock("log"):
                    log.progress(state.env_steps, sps, state.last_test_return, clock)
                if pruned and not last_phase:
                    self.stop_reason = "pruned"
                    log.message(f"pruned at {state.env_steps:,} env steps (test return "
                                f"{fmt_return(state.last_test_return)}): the sweeper judged this trial hopeless")
                    break
                if reached and not last_phase:  # at the budget's end it is simply the end of the run
                    stopped_early = True
                    log.message(f"test return {fmt_return(state.last_test_return)} >= stop reward {c.stop_reward}: "
                                f"stopping at {state.env_steps:,} env steps")
                    break
                # checkpoint (and the safe point for Ctrl-C / SIGTERM)
                if self._stop_signal is not None:
                    self._save(start)
                    name = signal.Signals(self._stop_signal).name
                    stopped = (f"{name}: stopped at {state.env_steps:,} env steps with a checkpoint saved; "
                               f"resume with: rl-train resume={self.run_dir}")
                    log.message(stopped)
                    if not log.show_console:  # log.console=false: stderr still says why the run ended, and how on
                        print(f"rl-train: {stopped}", file=sys.stderr)
                    log.close(status="KILLED")
                    self.close()
                    raise SystemExit(128 + self._stop_signal)
                if crossed(state.env_steps, previous, s.checkpoint_every) and state.env_steps < s.total_steps:
                    with clock("checkpoint"):
                        self._save(start)
                    if tracking is not None:
                        tracking.flush()  # the tracked runs hold at least what the checkpoint holds
        except EnvError as error:
            log.close(status="FAILED")
            self.close()
            at = state.env_steps + error.step  # the counter moves after a whole collect phase
            self._fail(f"env {self.c.cfg.env.id} {error} at env step {at:,}")
        except (CollectorError, Diverged) as error:
            log.close(status="FAILED")
            self.close()
            self._fail(str(error))
        except BaseException:
            log.close(status="KILLED" if self._stop_signal is not None else "FAILED")  # no-op after a clean stop
            raise
        finally:
            restore_signals()
        self.stop_reason = self.stop_reason or ("stop_reward" if stopped_early else "budget")
        state.finished = self.stop_reason != "pruned"  # a pruned run can still be resumed and finished
        with clock("checkpoint"):
            final = self._save(start)
        log.result(f"done: {state.env_steps:,} env steps in {state.train_seconds:.1f} s "
                    f"({(state.env_steps - start_steps) / (time.perf_counter() - start):.0f} SPS), "
                    f"last test return {fmt_return(state.last_test_return)}, "
                    f"{ {'budget': 'budget reached', 'stop_reward': 'stopped early'}.get(self.stop_reason, 'pruned')}")
        log.result(f"time: {clock.summary(top=8)}")
        # summary names of their own: a scalar tag at the final step would be a second point of that tag
        summary = {"final/test_return": state.last_test_return, "final/best_test_return": state.best_test_return,
                   "final/env_steps": state.env_steps, "final/train_seconds": state.train_seconds}
        log.close(summary={k: float(v) for k, v in summary.items() if v is not None},
                  files=run_files(self.run_dir, final, log.message) if tracking is not None else [])
        self.close()
        return _as_return(state.last_test_return)

    def _fail(self, message: str) -> NoReturn:
        """One line on stderr: what went wrong, and the last good checkpoint to resume from; exit code 1."""
        try:
            good = checkpoint.find_good(self.run_dir / "checkpoints", warn=lambda m: None)
        except OSError:
            good = None
        where = (f"the last good checkpoint is {good.relative_to(self.run_dir)} ({checkpoint_steps(good):,} env "
                 f"steps): rl-train resume={self.run_dir}" if good is not None else
                 "no checkpoint was saved before it (train.checkpoint_every sets how often one is)")
        with contextlib.suppress(Exception):
            logger.info("error: %s; %s", message, where)  # train.log; the console's line is below
        print(f"rl-train: error: {message}; {where}", file=sys.stderr)
        raise RunFailed(f"{message}; {where}")

    def _weights_due(self, updates: int) -> bool:
        """Whether this update's check reads every weight (~0.3 ms for SAC's 340k parameters, 2-3% of a one-step
        update). Every update of an on-policy run or with on_nonfinite=skip (its snapshot must be finite); else
        every 8th: a non-finite weight shows in the next update's losses anyway, and _save checks them all."""
        return self.c.spec.on_policy or self.c.settings.on_nonfinite == "skip" or updates % 8 == 0

    def _weights(self) -> list[Any]:
        networks = self.c.algo.networks
        return [*networks.parameters(), *networks.buffers()]

    def _on_nonfinite(self, problem: str, snapshot: dict[str, Any] | None, log: RunLogger) -> dict[str, Any]:
        """train.on_nonfinite: stop (raise Diverged), skip (put the weights back as they were before the update)
        or rollback (load the last good checkpoint into the components); at most train.max_nonfinite times."""
        s, state = self.c.settings, self.state
        self._nonfinite_events += 1
        what = f"{problem} after the update at {state.env_steps:,} env steps"
        if s.on_nonfinite == "stop" or self._nonfinite_events > s.max_nonfinite:
            limit = "" if s.on_nonfinite == "stop" else \
                f" ({self._nonfinite_events} times, more than train.max_nonfinite={s.max_nonfinite})"
            raise Diverged(f"{what}{limit}: stopped without saving it (a lower algo.lr or a gradient clip may help)")
        if s.on_nonfinite == "skip":
            assert snapshot is not None
            self.c.algo.load_state_dict(snapshot)
            log.message(f"warning: {what}: the update was undone (skip {self._nonfinite_events} of at most "
                        f"{s.max_nonfinite})")
            return {"nonfinite_events": float(self._nonfinite_events)}
        good = checkpoint.find_good(self.run_dir / "checkpoints", warn=log.message)
        if good is None:
            raise Diverged(f"{what}: nothing to roll back to")
        restored = restore(self.c, good)
        restored.stale_best = restored.stale_best or state.stale_best
        vars(state).update(vars(restored))
        log.rewind(state.env_steps)
        log.message(f"warning: {what}: rolled back to {good.name} ({state.env_steps:,} env steps; rollback "
                    f"{self._nonfinite_events} of at most {s.max_nonfinite})")
        self._rolled_back = True
        return {}

    def _start_tracking(self) -> Tracking | None:
        """MLflow / W&B runs for this run (the checkpoint's, when resuming). One line and exit code 2 if a sink
        cannot start: nothing has been trained yet."""
        settings = settings_of(self.c.cfg)
        if not settings.enabled:
            return None

        def warn(text: str) -> None:
            print(f"rl-train: warning: {text}", file=sys.stderr)
            logger.info("warning: %s", text)

        try:
            tracking = Tracking.start(self.c.cfg, self.run_dir, self.state.env_steps, self.state.tracking,
                                      self.sweep_group, warn)
        except ConfigError as error:
            self.close()
            if self.sweep_group is not None:
                raise  # a sweep's job: that job fails (its status says why), the sweep goes on
            print(f"rl-train: error: {error}", file=sys.stderr)
            raise SystemExit(2) from None
        self.state.tracking = tracking.run_ids
        return tracking

    def _planned_steps(self) -> int:
        """Where the run ends at the latest: whole collect phases until train.total_steps is reached."""
        per_phase = int(self.c.algo.n_steps) * self.c.settings.num_envs
        todo = max(0, self.c.settings.total_steps - self.state.env_steps)
        return self.state.env_steps + -(-todo // per_phase) * per_phase

    def _tb_cadence(self) -> int:
        """train.tb_every, or for auto: every update of an on-policy run (at most ~1000 points a run), ~300
        points for an off-policy run."""
        s = self.c.settings
        if isinstance(s.tb_every, int):
            return s.tb_every
        per_phase = int(self.c.algo.n_steps) * s.num_envs
        return max(per_phase, s.total_steps // (1000 if self.c.spec.on_policy else 300))

    def close(self) -> None:
        self.c.close()

    def _already_done(self) -> bool:
        state = self.state
        if not state.finished:
            return False
        stop, last = self.c.stop_reward, state.last_test_return
        reached = stop is not None and last is not None and last >= stop
        return state.env_steps >= self.c.settings.total_steps or reached

    def _test(self, log: RunLogger) -> None:
        c, state = self.c, self.state
        result = evaluate(c.test_envs, c.algo, c.algo.networks.normalizer, c.device,
                          seed=int(c.cfg.seed) + 100_003 * (state.tests + 1), obs_dtype=c.obs_dtype,
                          carry_size=c.carry_size, masks=c.spec.action_masks)
        state.tests += 1
        state.last_test_return = result.mean_return
        best = state.best_test_return
        state.best_test_return = result.mean_return if best is None else max(best, result.mean_return)
        if best is None or result.mean_return > best:
            save_best(c, state, self.run_dir)
            state.stale_best = False  # this run's own best replaced the stopped run's later one
            log.scalars({"eval/best_return": result.mean_return}, state.env_steps)
            log.message(f"new best test return {fmt_return(result.mean_return)} at {state.env_steps:,} env steps: "
                        "checkpoints/best.pt")
        log.scalars({"eval/return_mean": result.mean_return, "eval/return_std": float(result.returns.std()),
                     "eval/ep_len_mean": float(result.lengths.mean())}, state.env_steps)
        log.test_result(state.env_steps, result.returns.tolist(), result.lengths.tolist())

    def _record_video(self, log: RunLogger) -> None:
        """One deterministic test episode to videos/step-<env steps>-ep0-return<R>.<fmt>, and to TensorBoard.
        It draws no random numbers from the run, so a resumed run trains exactly as an unbroken one."""
        from rlcli import video

        c, steps = self.c, self.state.env_steps
        assert c.video_envs is not None
        fps = video.frames_per_second(c.video_envs)
        sink = video.VideoSink(self.run_dir / "videos", f"step-{steps:012d}", c.cfg.log.get("video_format", "mp4"),
                               fps, count=1, keep_every=1 if log.writer is not None else 0)
        try:
            result = evaluate(c.video_envs, c.algo, c.algo.networks.normalizer, c.device,
                              seed=int(c.cfg.seed) + 7_919 * (steps // max(1, int(c.cfg.log.video_every))),
                              obs_dtype=c.obs_dtype, carry_size=c.carry_size, frames=sink, masks=c.spec.action_masks)
        finally:
            sink.close()
        (recording,) = sink.finish(result.returns, result.lengths)
        if log.writer is not None and sink.kept:
            video.add_to_tensorboard(log.writer, "eval/video", sink.kept, steps, fps)
        log.message(f"video of a test episode at {steps:,} env steps (return {fmt_return(recording.episode_return)}): "
                    f"{recording.path.relative_to(self.run_dir)}")

    def _catch_stop_signals(self) -> Callable[[], None]:
        """First Ctrl-C / SIGTERM: finish the iteration, checkpoint, exit. A second one stops at once."""

        def handler(signum: int, frame: Any) -> None:
            if self._stop_signal is not None:
                raise StopNow(signum)
            self._stop_signal = signum

        previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):  # not the main thread (some launchers): leave signals alone
                previous[sig] = signal.signal(sig, handler)

        def restore() -> None:
            for sig, old in previous.items():
                signal.signal(sig, old)

        return restore

    # ------------------------------------------------------------------------------- checkpoints
    def _save(self, start: float) -> Path:
        if not self.run_dir.is_dir():  # deleted or moved while training: not silently re-made with checkpoints only
            raise FileNotFoundError(2, "No such file or directory", str(self.run_dir))
        problem = check_update({}, self._weights())
        if problem is not None:  # never written over, nor pruning, a good checkpoint
            raise Diverged(f"{problem} at {self.state.env_steps:,} env steps: not saved")
        self.state.train_seconds = self._seconds_before_run + time.perf_counter() - start
        path = save(self.c, self.state, self.run_dir)
        drop_stale_best(self.state, self.run_dir)
        return path


BUDGET_KEYS = ("train.total_steps", "algo.n_steps", "train.num_envs", "algo.train_freq")


def budget_warnings(c: Components, planned: int, typed: set[str] | None = None) -> list[str]:
    """What a user should know before a run whose budget does not do what it says. The rounding to whole collect
    phases is said only when the user typed one of its settings (`typed`: the command line's keys; None: always),
    so a shipped tuned config does not warn about itself."""
    s, algo, warnings = c.settings, c.algo, []
    per_phase = algo.n_steps * s.num_envs
    if planned > s.total_steps and (typed is None or any(key in typed for key in BUDGET_KEYS)):
        phase = "one rollout" if c.spec.on_policy else "one collect phase"
        what = f"{phase} is {algo.n_steps:,} x {s.num_envs} envs"
        key = "algo.n_steps" if c.spec.on_policy else "algo.train_freq"
        fix = (f"; for exactly {s.total_steps:,}, {key}={s.total_steps // s.num_envs}" if s.total_steps < per_phase
               and s.total_steps % s.num_envs == 0 else f"; {key} x train.num_envs dividing it trains exactly that")
        warnings.append(f"train.total_steps={s.total_steps:,} is not a whole number of collect phases ({what} = "
                        f"{per_phase:,} env steps): the run takes {planned:,} env steps{fix}")
    if not c.spec.on_policy and algo.learning_starts >= planned:
        warnings.append(f"algo.learning_starts={algo.learning_starts:,} >= the run's {planned:,} env steps: it acts "
                        "randomly throughout and never learns; lower algo.learning_starts or raise train.total_steps")
    return warnings


def _as_return(value: float | None) -> float:
    return float("nan") if value is None else value
