"""`hydra/launcher=population`: a sweep's jobs grouped into populations, each trained in one process.

Jobs whose configs differ only in values a population can batch (the seed and the numeric hyperparameters in
BATCHABLE) form one population, at most `max_members` each; any other difference starts another population.
Each job still gets the directory the basic launcher would give it (Hydra's own job set-up writes `.hydra/`),
its status record, checkpoints and logs. A population that cannot batch (an algorithm or setting the batched
update does not cover) runs its jobs one after another in this process, after a warning that says why.
"""

from __future__ import annotations

import copy
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from rlcli.registry import ConfigError
from rlcli.run.stop import stopped_during_start_up
from rlcli.sweeps import worker_processes
from rlcli.sweeps.population import workers

# algo.<key> values that may differ inside one population (each member's optimizer, losses, GAE, exploration and
# target network use its own). Not reward_scale: the vectorized losses read it from the first member's algorithm.
BATCHABLE = ("lr", "lr_pi", "lr_v", "gamma", "gae_lambda", "ent_coef", "vf_coef", "clip_range", "max_grad_norm",
             "tau", "target_update_interval", "exploration_fraction", "exploration_initial_eps",
             "exploration_final_eps", "ent_coef_init", "target_entropy", "noise_std", "target_kl",
             "kl_coef", "kl_target", "q_lambda")


def check_launcher_options(max_members: Any, n_jobs: Any) -> None:
    if not isinstance(max_members, int) or isinstance(max_members, bool) or max_members < 1:
        raise ConfigError(f"hydra.launcher.max_members={max_members!r} must be an integer >= 1 (jobs per population)")
    if n_jobs == "auto":
        return
    if not isinstance(n_jobs, int) or isinstance(n_jobs, bool) or n_jobs < 1:
        raise ConfigError(f"hydra.launcher.n_jobs={n_jobs!r} must be auto or an integer >= 1 (populations trained at "
                          "once, each in its own process)")


def population_key(cfg: DictConfig) -> str:
    """What must be equal for jobs to share a population: the whole config but hydra, the seed, `resume` and
    the batchable algorithm values (the run's and each of algo.groups')."""
    plain = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(plain, dict)
    plain = {k: v for k, v in plain.items() if k not in ("hydra", "seed", "resume")}
    algo = dict(plain.get("algo") or {})
    for key in BATCHABLE:
        algo.pop(key, None)
    if isinstance(algo.get("groups"), dict):  # algo.groups: each group's own batchable values too (a group left
        kept = {group: {k: v for k, v in own.items() if k not in BATCHABLE} if isinstance(own, dict) else own
                for group, own in algo["groups"].items()}  # with nothing else of its own is one not named)
        algo["groups"] = {group: own for group, own in kept.items() if own != {}}
    plain["algo"] = algo
    return OmegaConf.to_yaml(OmegaConf.create(plain))


def group_jobs(configs: Sequence[DictConfig], max_members: int) -> list[list[int]]:
    """Indices of the jobs of each population, in sweep order, split into at most `max_members` each."""
    groups: dict[str, list[int]] = {}
    for index, cfg in enumerate(configs):
        groups.setdefault(population_key(cfg), []).append(index)
    return [indices[i:i + max_members] for indices in groups.values() for i in range(0, len(indices), max_members)]


def split_for_workers(groups: list[list[int]], n_jobs: int) -> list[list[int]]:
    """Halve the largest populations until every worker has one (a population of one member is not split)."""
    groups = [list(g) for g in groups]
    while len(groups) < n_jobs:
        largest = max(groups, key=len)
        if len(largest) < 2:
            break
        groups.remove(largest)
        half = (len(largest) + 1) // 2
        groups += [largest[:half], largest[half:]]
    return sorted(groups, key=lambda g: g[0])


def compose_each_job_once(config_loader: Any) -> None:
    """Hydra's sweepers compose every job's config to check a batch before handing it to the launcher, which
    composes each again (8 PPO jobs: 20 compositions in rl-train before any population began, 12 now; about
    0.1 s each here). The launcher takes the check's configs: the first composition of a job's
    overrides is kept (a copy, as it was composed) for the next request of the same overrides, which takes it; a
    third composes again. A job whose overrides differ from an earlier job's only in a plain `seed=<n>` is that
    job's composition with the seed set (`_with_seed`): a seed sweep composes once per other setting, not per
    job, while rl-train's start-up waits on it."""
    load = config_loader.load_sweep_config
    if getattr(load, "composes_each_job_once", False):
        return
    kept: dict[tuple[int, tuple[str, ...]], DictConfig] = {}
    by_other_settings: dict[tuple[int, tuple[str, ...]], DictConfig] = {}  # a composition for each seed pattern

    def load_sweep_config(master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        key = (id(master_config), tuple(sweep_overrides))
        if key in kept:
            return kept.pop(key)
        pattern = (id(master_config), _seed_pattern(sweep_overrides))
        earlier = by_other_settings.get(pattern) if pattern[1] else None
        composed = _with_seed(earlier, sweep_overrides) if earlier is not None else None
        if composed is None:
            composed = load(master_config=master_config, sweep_overrides=sweep_overrides)
            if pattern[1]:
                by_other_settings[pattern] = copy.deepcopy(composed)
        kept[key] = copy.deepcopy(composed)
        return composed

    load_sweep_config.composes_each_job_once = True  # type: ignore[attr-defined]
    config_loader.load_sweep_config = load_sweep_config


def _plain_seed(override: str) -> bool:
    value = override[len("seed="):]
    return override.startswith("seed=") and value.isascii() and value.isdigit() and str(int(value)) == value


def _seed_pattern(overrides: Sequence[str]) -> tuple[str, ...]:
    """The overrides with their one plain `seed=<n>` as `seed=*`; () where there is not exactly one such seed (and
    no other)."""
    seeds = [i for i, o in enumerate(overrides) if o.startswith("seed=")]
    if len(seeds) != 1 or not _plain_seed(overrides[seeds[0]]):
        return ()
    return tuple("seed=*" if i == seeds[0] else o for i, o in enumerate(overrides))


def _with_seed(composed: DictConfig, overrides: Sequence[str]) -> DictConfig | None:
    """`composed` (a job's composition whose overrides were `overrides` but for their plain seed) as Hydra composes
    `overrides`: a copy with the seed set, in the task's overrides too, and the override dirname made again from
    them (tested against Hydra's own composition); None where its task overrides hold no one plain seed."""
    from hydra._internal.config_loader_impl import get_overrides_dirname
    from hydra.core.override_parser.overrides_parser import OverridesParser

    seed = next(o for o in overrides if o.startswith("seed="))
    task = list(OmegaConf.select(composed, "hydra.overrides.task", default=None) or [])
    at = [i for i, o in enumerate(task) if o.startswith("seed=")]
    if len(at) != 1 or not _plain_seed(task[at[0]]):
        return None
    out = copy.deepcopy(composed)
    task[at[0]] = seed
    dirname = out.hydra.job.config.override_dirname
    with open_dict(out):
        out.seed = int(seed[len("seed="):])
        out.hydra.overrides.task[at[0]] = seed
        out.hydra.job.override_dirname = get_overrides_dirname(
            overrides=OverridesParser.create().parse_overrides(task), kv_sep=dirname.kv_sep,
            item_sep=dirname.item_sep, exclude_keys=dirname.exclude_keys)
    return out


def launch(hydra_context: Any, config: DictConfig, job_overrides: Sequence[Sequence[str]], initial_job_idx: int,
           max_members: int, n_jobs: int | str = "auto") -> list[Any]:
    configs = []
    for offset, overrides in enumerate(job_overrides):
        sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = sweep_config.hydra.job.num = initial_job_idx + offset
        configs.append(sweep_config)
    n_jobs = workers.workers_for(n_jobs, configs)
    groups = split_for_workers(group_jobs(configs, max_members), n_jobs)
    if n_jobs == 1:
        outcomes = []
        for group in groups:
            outcomes.append(run_population(hydra_context, [configs[i] for i in group]))
            if outcomes[-1][1] is not None:
                break  # a signal stopped it: the rest of the sweep waits for resume=auto
    else:  # populations in parallel worker processes: the standard library's pool, so no other package is needed
        import pickle
        from concurrent.futures import ProcessPoolExecutor
        from concurrent.futures.process import BrokenProcessPool

        from hydra.core.singleton import Singleton

        state = Singleton.get_state()
        context = workers.worker_context(bool(configs[0].get("compile", False)))
        sent = _pickled(hydra_context, state)
        with worker_processes.signals_passed_on() as received:
            try:
                pool: list[Any] = []  # the worker processes, for their exit codes if one is killed
                with ProcessPoolExecutor(max_workers=n_jobs, mp_context=context) as executor:
                    futures = [executor.submit(_population_in_worker, sent, [configs[i] for i in group])
                               for group in groups]
                    pool[:] = list((getattr(executor, "_processes", None) or {}).values())
                    outcomes = [pickle.loads(future.result()) for future in futures]
            except Exception as error:
                if received["signum"] is None:
                    if isinstance(error, BrokenProcessPool):  # a worker was killed; the pool stops the others
                        killed = sorted((p.exitcode for p in pool if p.exitcode is not None and p.exitcode < 0),
                                        key=lambda code: code == -signal.SIGTERM)  # the pool SIGTERMs the others
                        print(worker_processes.worker_died(error, str(config.hydra.sweep.dir), exit_codes=killed[:1]),
                              file=sys.stderr)
                        raise SystemExit(1) from None
                    raise
                # a worker that the signal reached before its handlers were set (its first second) died of it
                outcomes = [([], received["signum"])]
    stopped_by = next((signum for _, signum in outcomes if signum is not None), None)
    if stopped_by is not None:
        if not any(returns for returns, _ in outcomes):  # every worker stopped while it set up: say it once
            print(stopped_during_start_up(stopped_by), file=sys.stderr)
        raise SystemExit(128 + stopped_by)
    return [ret for returns, _ in outcomes for ret in returns]


def _pickled(hydra_context: Any, singleton_state: Any) -> bytes:
    """Hydra's context and singletons as the workers get them, with cloudpickle (which the base install has through
    gymnasium), as joblib's pool sends them: they hold local functions (OmegaConf's resolvers, the config loader's
    `compose_each_job_once`) that the standard library's pickle cannot send."""
    import cloudpickle

    return bytes(cloudpickle.dumps((hydra_context, singleton_state)))


def _population_in_worker(pickled: bytes, configs: list[DictConfig]) -> bytes:
    """The pool's task: the population's outcome sent back with cloudpickle too (its Hydra returns name classes of
    Hydra's plugins, which the worker imported again)."""
    import cloudpickle

    return bytes(cloudpickle.dumps(_run_population_in_worker(pickled, configs)))


def _run_population_in_worker(pickled: bytes, configs: list[DictConfig]) -> tuple[list[Any], int | None]:
    """In a worker process: one population, with Hydra's context and singletons from `_pickled`."""
    import pickle

    from hydra.core.singleton import Singleton
    from hydra.core.utils import setup_globals

    worker_processes.set_up_worker()
    if worker_processes.stopped_by() is not None:  # the sweep was stopped before the pool handed this population over
        return [], worker_processes.stopped_by()
    received: dict[str, int | None] = {"signum": None}

    def during_start_up(signum: int, frame: Any) -> None:  # before the population's loop catches signals itself
        if received["signum"] is None:
            received["signum"] = signum
            raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, during_start_up) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        setup_globals()
        hydra_context, singleton_state = pickle.loads(pickled)
        Singleton.set_state(singleton_state)
        returns, signum = run_population(hydra_context, configs)
        worker_processes.remember_stop(signum)
        return returns, signum
    except KeyboardInterrupt:
        if received["signum"] is None:
            raise
        worker_processes.remember_stop(received["signum"])
        return [], received["signum"]  # stopped before training began: nothing of it to save
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        worker_processes.exit_if_orphaned()


def run_population(hydra_context: Any, configs: list[DictConfig]) -> tuple[list[Any], int | None]:
    """Set up each job (Hydra's job directory and files, then rlcli's member) and train them as one population.
    Returns the jobs' Hydra returns (their status records as values) and the signal that stopped it, if any."""
    from hydra.core.utils import run_job

    from rlcli.sweeps.population.loop import train_population
    from rlcli.sweeps.population.members import Member

    returns, members = [], []
    for cfg in configs:
        ret = run_job(hydra_context=hydra_context, task_function=_prepare_member, config=cfg,
                      job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
        returns.append(ret)
        prepared = ret._return_value  # read directly: the property re-raises a task's exception
        if isinstance(prepared, BaseException):
            raise prepared
        if isinstance(prepared, Member):  # a member to train (else its record: the job is already over)
            members.append(prepared)
    stopped_by = None
    if members:
        population = _batched_update(members)
        stopped_by = _one_by_one(members) if population is None else train_population(members, population)
    for ret in returns:
        if isinstance(ret._return_value, Member):
            ret.return_value = ret._return_value.record
    return returns, stopped_by


def _prepare_member(cfg: DictConfig) -> Any:
    """Hydra's task function for one job: its run dir locked, its record written, its components built (or
    resumed), as a single job's (sweeps/jobs.open_job). Returns the Member, or the job's final record when it is
    already done or failed to build."""
    from hydra.core.hydra_config import HydraConfig

    from rlcli.sweeps.jobs import open_job, shown_overrides
    from rlcli.sweeps.population.members import Member
    from rlcli.sweeps.tuning import trial_reporter

    job = HydraConfig.get()
    run_dir, job_num, overrides = Path(job.runtime.output_dir), int(job.job.num), list(job.overrides.task)
    record, trainer = open_job(cfg, run_dir, job_num, overrides, trial_reporter)
    return record if trainer is None else Member(trainer, run_dir, job_num, shown_overrides(overrides), record)


def _batched_update(members: list[Any]) -> Any:
    """The population's update, or None (after a warning naming why) when these members cannot batch."""
    from rlcli.algos.grouped import GroupedOnPolicy
    from rlcli.collectors.local import Collector
    from rlcli.collectors.offline import OfflineCollector, OfflineThenOnline
    from rlcli.services.log import console
    from rlcli.sweeps.population.groups import GroupedPopulation
    from rlcli.sweeps.population.lockstep import population_update

    if len(members) == 1:
        return None
    try:
        if any(isinstance(m.trainer.c.collector, OfflineThenOnline) for m in members):
            raise ConfigError("offline.online_steps > 0 cannot train in a population yet (offline runs can)")
        if not all(isinstance(m.trainer.c.collector, (Collector, OfflineCollector)) for m in members):
            raise ConfigError("collector=ray cannot train in a population (its workers step the envs): the local "
                              "collector can")
        algos, storages = [m.trainer.c.algo for m in members], [m.trainer.c.buffer for m in members]
        if isinstance(algos[0], GroupedOnPolicy):  # algo.groups: a lockstep population per group
            return GroupedPopulation(algos, storages)
        return population_update(algos, storages)
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
