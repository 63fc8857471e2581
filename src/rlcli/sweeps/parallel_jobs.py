"""Sweep jobs in the joblib launcher's worker processes (`hydra/launcher=joblib`, which rl-train runs through
hydra_plugins/rlcli_joblib_launcher): Ctrl-C or SIGTERM stops the sweep as it stops the basic launcher's, every
running job at its next safe point with its checkpoint, and no waiting job starts. The job side
(`run_job_stoppably`) serves the Ray launcher's tasks too (ray_jobs.py has its launch).

Before, the signal interrupted joblib in rl-train, which killed the workers: their jobs lost all their training
since their last checkpoint (by default, all of it), their records said `running`, and rl-train said that nothing
was trained."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from rlcli.run.stop import StopSignals
from rlcli.sweeps import worker_processes

# Hydra's plugin, and the subclass rl-train puts in its place (entry/rl_train.py)
JOBLIB_TARGET = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"
STOPPABLE_TARGET = "hydra_plugins.rlcli_joblib_launcher.joblib_jobs_launcher.JoblibJobsLauncher"


def launch_stoppably(launch: Callable[[], Any], sweep_dir: str) -> Any:
    """In rl-train: Hydra's joblib launch, with signals passed on to the workers. After a signal, rl-train exits
    128 + the signal once every worker has saved its job, with one line on how to finish the sweep."""
    with worker_processes.signals_passed_on() as received:
        try:
            returns = launch()
        except Exception as error:
            if received["signum"] is None:
                if type(error).__name__ == "TerminatedWorkerError":  # joblib's: a worker was killed from outside
                    print(worker_processes.worker_died(error, sweep_dir, "job", "job"), file=sys.stderr)
                    raise SystemExit(1) from None
                raise
            returns = None  # a worker the signal reached before its handlers were set (its first second) died of it
    if received["signum"] is None:
        return returns
    exit_stopped_sweep(received["signum"], sweep_dir)


def exit_stopped_sweep(signum: int, sweep_dir: str) -> NoReturn:
    """rl-train's last line after a signal stopped a parallel sweep, once its running jobs have saved; exit code
    128 + the signal, as a stopped single run's."""
    print(f"rl-train: {signal.Signals(signum).name}: the sweep stopped; its running jobs saved checkpoints and its "
          f"waiting jobs did not start; finish it with the same command plus hydra.sweep.dir={sweep_dir} resume=auto",
          file=sys.stderr)
    raise SystemExit(128 + signum)


def run_job_stoppably(run: Callable[[Callable[[StopSignals], bool] | None], dict[str, Any]], run_dir: Path,
                      job_num: int, overrides: list[str], in_ray_task: bool = False) -> dict[str, Any]:
    """One job of a joblib or Ray sweep, `run(may_train)` being sweeps/jobs.run_job.

    In a joblib worker process: a signal that stopped the sweep before this job was handed over leaves it
    untrained (recorded `interrupted`, so that resume=auto starts it); one during its set-up goes to its trainer,
    which stops at its first safe point; and the job's stop returns its record instead of ending the worker. With
    `n_jobs=1` (rl-train's own process) only the first holds: rl-train then stops as the basic launcher does.

    In a Ray task (`in_ray_task`), the cancel (ray_jobs.py) comes as SIGINT: during training the trainer stops with
    its checkpoint, during set-up it is a KeyboardInterrupt; either way the record says `interrupted` and the task
    returns (Ray reuses its worker process, which keeps nothing of the stop)."""
    worker = in_ray_task or worker_processes.in_worker_process()
    if worker and not in_ray_task:
        worker_processes.set_up_worker()
    from rlcli.sweeps.jobs import read_status

    try:
        if in_ray_task:
            return run(None)
        if worker_processes.stopped_by() is not None:
            return _not_started(run_dir, job_num, overrides, worker_processes.stopped_by())
        return run(worker_processes.adopt)
    except KeyboardInterrupt:
        if not in_ray_task:
            raise
        return _stopped_in_set_up(run_dir, job_num, overrides)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
        if not worker or code <= 128:
            raise
        if not in_ray_task:
            worker_processes.remember_stop(code - 128)  # the trainer saved a checkpoint, the record says interrupted
        return read_status(run_dir) or {"job": job_num, "overrides": overrides, "status": "interrupted"}
    finally:
        worker_processes.release_adopted()
        if worker:
            worker_processes.exit_if_orphaned()


def _stopped_in_set_up(run_dir: Path, job_num: int, overrides: list[str]) -> dict[str, Any]:
    from rlcli.sweeps.jobs import read_status, write_status

    record = read_status(run_dir) or {"job": job_num, "overrides": overrides}
    if record.get("status") == "running":  # its set-up began; nothing was trained since
        record.update(status="interrupted", error="stopped before training began")
        write_status(run_dir, record)
    return record


def _not_started(run_dir: Path, job_num: int, overrides: list[str], signum: int | None) -> dict[str, Any]:
    """The record of a job the sweep's stop came before: an earlier record stays as it was (a resumed sweep's
    completed or interrupted job); else `interrupted`, which resume=auto starts."""
    from rlcli.sweeps.jobs import read_status, write_status

    earlier = read_status(run_dir)
    if earlier is not None:
        return earlier
    name = signal.Signals(signum).name if signum is not None else "a signal"
    record = {"job": job_num, "overrides": overrides, "status": "interrupted",
              "error": f"not started: the sweep was stopped ({name}) first"}
    write_status(run_dir, record)
    return record
