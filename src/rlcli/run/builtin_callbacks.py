"""The loop's own steps after an update, as callbacks in one explicit order (`builtin_callbacks`).

Each is a small object with one point, `after_iteration(it)`, that reads the run through its trainer; True ends the
loop there. They are the trainer's, so they see what a user's callback does not (the logger, the signals, the
iteration). A user's callbacks (callbacks.py) run at fixed places among them: `after_update` before the first,
`after_test` inside the test phase, `on_checkpoint` after every checkpoint, `on_end` after the final one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlcli.collectors.local import CollectStats
from rlcli.contracts import OnPolicyLearner
from rlcli.run.build import Components
from rlcli.run.evaluation import record_video, test_phase
from rlcli.run.state import TrainState
from rlcli.services.log import fmt_return

if TYPE_CHECKING:
    from rlcli.collectors.testing import TestStats
    from rlcli.run.trainer import Trainer


def crossed(step: int, previous: int, every: int) -> bool:
    """True when the clock passed a multiple of `every` between `previous` and `step`."""
    return every > 0 and step // every > previous // every


@dataclass
class Iteration:
    """One pass of the loop: what its collect and update produced, for the steps after them."""

    previous: int  # env steps before this iteration's collect
    stats: CollectStats
    scheduled: dict[str, float] = field(default_factory=dict)  # the schedules' values for this iteration
    metrics: dict[str, Any] = field(default_factory=dict)
    sps: float = 0.0
    last_phase: bool = False  # the budget is reached with this iteration
    stop: str | None = None  # why the run ends after this iteration: stop_reward, pruned, a callback's reason
    tested: TestStats | None = None  # this iteration's test episodes when the caller ran them (a population)


class LoopCallback:
    """A built-in step of every iteration after its update; `after_iteration` returns True to end the loop."""

    def __init__(self, trainer: Trainer) -> None:
        self.t = trainer

    def after_iteration(self, it: Iteration) -> bool:
        raise NotImplementedError


class TestPhase(LoopCallback):
    """Test episodes every test.every env steps and at the budget's end (best.pt kept by test_phase); the user's
    after_test sees every one; train.stop_reward reached ends the run after this iteration's logs."""

    def after_iteration(self, it: Iteration) -> bool:
        t = self.t
        if not t.test_due(it):
            return False
        with t.c.clock("test"):
            result = test_phase(t.c, t.state, t.run_dir, t.log, it.tested)
        requested = t.callbacks.after_test(t.context, result)
        last, stop_reward = t.state.last_test_return, t.c.stop_reward
        reached = stop_reward is not None and last is not None and last >= stop_reward
        it.stop = "stop_reward" if reached else it.stop or requested
        return False


class Video(LoopCallback):
    """One recorded test episode each time log.video_every env steps pass."""

    def after_iteration(self, it: Iteration) -> bool:
        c = self.t.c
        if c.video_envs is not None and crossed(self.t.state.env_steps, it.previous, int(c.cfg.log.video_every)):
            with c.clock("test"):
                record_video(c, self.t.state.env_steps, self.t.run_dir, self.t.log)
        return False


def tb_cadence(c: Components) -> int:
    """train.tb_every, or for auto: every update of an on-policy run (at most ~1000 points a run), ~300
    points for an off-policy run."""
    s = c.settings
    if isinstance(s.tb_every, int):
        return s.tb_every
    per_phase = c.steps_per_phase
    return max(per_phase, s.total_steps // (1000 if isinstance(c.learner, OnPolicyLearner) else 300))


class Logging(LoopCallback):
    """TensorBoard points (and the tracked runs') at their cadence, console tables at theirs, the progress bar
    every iteration."""

    def __init__(self, trainer: Trainer) -> None:
        super().__init__(trainer)
        self.tb_every = tb_cadence(trainer.c)

    def after_iteration(self, it: Iteration) -> bool:
        c, state, log = self.t.c, self.t.state, self.t.log
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
        return False


class StopMessage(LoopCallback):
    """A run that ends before its budget (stop reward, pruned, a callback's request) says why and how to go on."""

    def after_iteration(self, it: Iteration) -> bool:
        t = self.t
        if it.stop is None or it.last_phase:  # at the budget's end it is simply the end
            return False
        t.log.message(stop_line(it.stop, t.state, t.c.stop_reward, t.run_dir, str(t.c.cfg.env.id), t.c.unit))
        t.stop_reason = it.stop
        return True


class SignalSafePoint(LoopCallback):
    """Ctrl-C / SIGTERM are acted on here: a checkpoint, one line, StoppedBySignal (Trainer.stop_on_signal)."""

    def after_iteration(self, it: Iteration) -> bool:
        self.t.stop_on_signal()
        return False


class Checkpoints(LoopCallback):
    """A checkpoint each train.checkpoint_every env steps before the budget's end (the final one is finish's),
    then the tracked runs flushed, so that they hold at least what the checkpoint holds."""

    def after_iteration(self, it: Iteration) -> bool:
        t = self.t
        steps = t.state.env_steps
        if crossed(steps, it.previous, t.c.settings.checkpoint_every) and steps < t.c.settings.total_steps:
            t.save()
            if t.tracking is not None:
                t.tracking.flush()
        return False


def builtin_callbacks(trainer: Trainer) -> list[LoopCallback]:
    """The order matters: the log sees the test's return and stop, a stop leaves before the signal's checkpoint,
    a signal's checkpoint replaces the cadence's."""
    return [TestPhase(trainer), Video(trainer), Logging(trainer), StopMessage(trainer), SignalSafePoint(trainer),
            Checkpoints(trainer)]


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
