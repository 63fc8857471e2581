"""A sweep's jobs as Ray tasks (`hydra/launcher=ray` / `ray_cluster`, run through hydra_plugins/rlcli_ray_launcher),
stoppable: Ctrl-C or SIGTERM to rl-train cancels every task of the sweep. Ray raises a running task's cancel as
SIGINT in its worker (`_thread.interrupt_main`), where the job's trainer takes it like a terminal's Ctrl-C: a
checkpoint at its next safe point, its record `interrupted`. A task still waiting for a CPU never starts.

Before, rl-train died of the signal, and Ray then killed the tasks of the finished driver. Each running job lost its
training since its last checkpoint (by default all of it), and its record still said `running`.

The submission follows Hydra's plugin (hydra_ray_launcher/_core.py): the same config per job and the same remote
function; only the waiting and the signals are ours."""

from __future__ import annotations

import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import open_dict

from rlcli.sweeps.parallel_jobs import exit_stopped_sweep

# Hydra's plugin, and the subclass rl-train puts in its place (entry/rl_train.py)
RAY_TARGET = "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher"
STOPPABLE_RAY_TARGET = "hydra_plugins.rlcli_ray_launcher.ray_jobs_launcher.RayJobsLauncher"


def launch_on_ray(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[Any]:
    import ray
    from hydra.core.singleton import Singleton
    from hydra.core.utils import configure_log, setup_globals
    from hydra_plugins.hydra_ray_launcher._launcher_util import launch_job_on_ray, start_ray

    setup_globals()
    configure_log(launcher.config.hydra.hydra_logging, launcher.config.hydra.verbose)
    sweep_dir = str(launcher.config.hydra.sweep.dir)
    Path(sweep_dir).mkdir(parents=True, exist_ok=True)
    launcher.ray_cfg.init.setdefault("object_store_memory", 78643200)  # the plugin's default (None: Ray's own)
    start_ray(launcher.ray_cfg.init)
    tasks: list[Any] = []
    received: dict[str, int | None] = {"signum": None}

    def cancel_all(signum: int, frame: Any) -> None:
        if received["signum"] is not None:
            return  # the first signal's cancel is under way
        received["signum"] = signum
        for task in tasks:
            ray.cancel(task, force=False)  # running: SIGINT in its worker; waiting: never starts

    previous = {sig: signal.signal(sig, cancel_all) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for offset, overrides in enumerate(job_overrides):
            if received["signum"] is not None:
                break  # stopped while submitting: the rest never starts
            config = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(overrides))
            with open_dict(config):
                config.hydra.job.id = f"job_id_for_{initial_job_idx + offset}"
                config.hydra.job.num = initial_job_idx + offset
            tasks.append(launch_job_on_ray(launcher.hydra_context, launcher.ray_cfg.remote, config,
                                           launcher.task_function, Singleton.get_state()))
        returns = [_result(task, received) for task in tasks]
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    if received["signum"] is None:
        return returns
    exit_stopped_sweep(received["signum"], sweep_dir)


def _result(task: Any, received: dict[str, int | None]) -> Any:
    """The job's JobReturn; None for a job the sweep's stop cancelled (Ray answers a cancelled task with
    TaskCancelledError, whether it never started or stopped with its checkpoint)."""
    import ray

    try:
        return ray.get(task)
    except ray.exceptions.TaskCancelledError:
        if received["signum"] is None:
            raise
        return None
