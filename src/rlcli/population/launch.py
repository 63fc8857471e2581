"""`hydra/launcher=population`: a sweep's jobs grouped into populations, each trained in one process.

Jobs whose configs differ only in values a population can batch (the seed and the numeric hyperparameters in
BATCHABLE) form one population, at most `max_members` each; any other difference starts another population.
Each job still gets the directory the basic launcher would give it (Hydra's own job set-up writes `.hydra/`),
its status record, checkpoints and logs. A population that cannot batch (an algorithm or setting the batched
update does not cover) runs its jobs one after another in this process, after a warning that says why.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from rlcli import run_lock
from rlcli.registry import ConfigError

logger = logging.getLogger("rlcli")

# algo.<key> values that may differ inside one population (each member's optimizer, losses and GAE use its own)
BATCHABLE = ("lr", "lr_pi", "lr_v", "gamma", "gae_lambda", "ent_coef", "vf_coef", "clip_range", "max_grad_norm")


def check_launcher_options(max_members: Any, n_jobs: Any) -> None:
    if not isinstance(max_members, int) or isinstance(max_members, bool) or max_members < 1:
        raise ConfigError(f"hydra.launcher.max_members={max_members!r} must be an integer >= 1 (jobs per population)")
    if n_jobs != 1:
        raise ConfigError(f"hydra.launcher.n_jobs={n_jobs!r}: the population launcher runs one population at a "
                          "time so far (n_jobs=1); a population already shares its update across members")


def population_key(cfg: DictConfig) -> str:
    """What must be equal for jobs to share a population: the whole config but hydra, the seed, `resume` and
    the batchable algorithm values."""
    plain = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(plain, dict)
    plain = {k: v for k, v in plain.items() if k not in ("hydra", "seed", "resume")}
    algo = dict(plain.get("algo") or {})
    for key in BATCHABLE:
        algo.pop(key, None)
    plain["algo"] = algo
    return OmegaConf.to_yaml(OmegaConf.create(plain))


def group_jobs(configs: Sequence[DictConfig], max_members: int) -> list[list[int]]:
    """Indices of the jobs of each population, in sweep order, split into at most `max_members` each."""
    groups: dict[str, list[int]] = {}
    for index, cfg in enumerate(configs):
        groups.setdefault(population_key(cfg), []).append(index)
    return [indices[i:i + max_members] for indices in groups.values() for i in range(0, len(indices), max_members)]


def launch(hydra_context: Any, config: DictConfig, job_overrides: Sequence[Sequence[str]], initial_job_idx: int,
           max_members: int) -> list[Any]:
    from hydra.core.utils import run_job

    from rlcli.population.loop import train_population
    from rlcli.population.members import Member

    configs = []
    for offset, overrides in enumerate(job_overrides):
        sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = sweep_config.hydra.job.num = initial_job_idx + offset
        configs.append(sweep_config)
    returns: list[Any] = [None] * len(configs)
    stopped_by: int | None = None
    for group in group_jobs(configs, max_members):
        members = []
        for index in group:
            ret = run_job(hydra_context=hydra_context, task_function=_prepare_member, config=configs[index],
                          job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
            returns[index] = ret
            prepared = ret._return_value  # read directly: the property re-raises a task's exception
            if isinstance(prepared, BaseException):
                raise prepared
            if isinstance(prepared, Member):  # a member to train (else its record: the job is already over)
                members.append(prepared)
        if not members:
            continue
        update = _batched_update(members)
        stopped_by = _one_by_one(members) if update is None else train_population(members, update)
        for index in group:
            value = returns[index]._return_value
            if isinstance(value, Member):
                returns[index].return_value = value.record
        if stopped_by is not None:
            break
    if stopped_by is not None:
        raise SystemExit(128 + stopped_by)
    return [r for r in returns if r is not None]


def _prepare_member(cfg: DictConfig) -> Any:
    """Hydra's task function for one job: its run dir locked, its record written, its components built (or
    resumed). Returns the Member, or the job's final record when it is already done or failed to build."""
    from hydra.core.hydra_config import HydraConfig

    from rlcli.population.members import Member
    from rlcli.sweep import end_record, job_trainer, start_record
    from rlcli.tuning import trial_reporter

    hydra_cfg = HydraConfig.get()
    run_dir, job_num = Path(hydra_cfg.runtime.output_dir), int(hydra_cfg.job.num)
    overrides = list(hydra_cfg.overrides.task)
    shown = " ".join(o for o in overrides if not o.startswith(("sweep.trial", "resume=", "hydra.")))
    try:
        run_lock.acquire(run_dir)
    except ConfigError as error:  # another process runs this job: its directory is left alone
        return {"job": job_num, "overrides": overrides, "status": "failed", "error": str(error)}
    record = start_record(cfg, run_dir, job_num, overrides, shown)
    if record["status"] != "running":
        run_lock.release(run_dir)
        return record
    try:
        trainer = job_trainer(cfg, run_dir, job_num, overrides, time.perf_counter(), trial_reporter)
    except Exception as error:
        run_lock.release(run_dir)
        return end_record(record, run_dir, job_num, shown, error=error)
    return Member(trainer, run_dir, job_num, shown, record)


def _batched_update(members: list[Any]) -> Any:
    """The population's update, or None (after a warning naming why) when these members cannot batch."""
    from rlcli.log import console
    from rlcli.population.onpolicy import PopulationUpdate

    if len(members) == 1:
        return None
    try:
        return PopulationUpdate([m.trainer.c.algo for m in members])
    except ConfigError as error:
        jobs = ", ".join(str(m.job_num) for m in members)
        console.print(f"rl-train: warning: population launcher: {error}; jobs {jobs} run one at a time",
                      highlight=False, markup=False, soft_wrap=True)
        return None


def _one_by_one(members: list[Any]) -> int | None:
    """The basic launcher's way, over the members already built: each trains alone, in turn."""
    for member in members:
        with member.turn():
            try:
                member.trainer.run()
            except BaseException as error:
                member.end(error)
                if isinstance(error, SystemExit) and not isinstance(error, Exception):
                    code = error.code if isinstance(error.code, int) else 1
                    if code > 128:
                        return code - 128
                continue
            member.end()
    return None
