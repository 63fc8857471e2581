"""The loop's steps after an update that only read the run: recording a video, logging, the stop line.

Plain functions of the run's components (`Components`), its counters (`TrainState`) and the iteration, so the
trainer (trainer.py) reads as the loop itself and a population (sweeps/population/) calls the same steps per member.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlcli.collectors.local import CollectStats
from rlcli.contracts import OnPolicyLearner
from rlcli.run.build import Components
from rlcli.run.evaluation import record_video
from rlcli.run.state import TrainState
from rlcli.services.log import RunLogger, fmt_return


def crossed(step: int, previous: int, every: int) -> bool:
    """True when the clock passed a multiple of `every` between `previous` and `step`."""
    return every > 0 and step // every > previous // every


@dataclass
class Iteration:
    """One pass of the loop: what its collect and update produced, for the steps after them."""

    previous: int  # env steps before this iteration's collect
    stats: CollectStats
    metrics: dict[str, Any] = field(default_factory=dict)
    sps: float = 0.0
    last_phase: bool = False  # the budget is reached with this iteration
    stop: str | None = None  # why the run ends after this iteration: stop_reward, pruned, a callback's reason


def video_phase(c: Components, state: TrainState, it: Iteration, run_dir: Path, log: RunLogger) -> None:
    """One recorded test episode each time log.video_every env steps pass."""
    if c.video_envs is not None and crossed(state.env_steps, it.previous, int(c.cfg.log.video_every)):
        with c.clock("test"):
            record_video(c, state.env_steps, run_dir, log)


def tb_cadence(c: Components) -> int:
    """train.tb_every, or for auto: every update of an on-policy run (at most ~1000 points a run), ~300
    points for an off-policy run."""
    s = c.settings
    if isinstance(s.tb_every, int):
        return s.tb_every
    per_phase = c.steps_per_phase
    return max(per_phase, s.total_steps // (1000 if isinstance(c.learner, OnPolicyLearner) else 300))


def log_phase(c: Components, state: TrainState, it: Iteration, log: RunLogger, tb_every: int) -> None:
    """TensorBoard points at their cadence, console tables at theirs, the progress bar every iteration."""
    s, clock = c.settings, c.clock
    table_due = crossed(state.env_steps, it.previous, s.log_every) or it.last_phase or it.stop == "stop_reward"
    if table_due or crossed(state.env_steps, it.previous, tb_every):
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
