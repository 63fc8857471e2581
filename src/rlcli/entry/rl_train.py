"""`rl-train`: compose the config with Hydra, check it, build the trainer, run it.

`resume=...` is turned into the run's own command line first (see run/resume.py). Before Hydra
creates or touches a run directory, `main` composes the config once with the Compose API and
builds the run's components from it (which also loads and checks a checkpoint to resume), so a
typo in a group choice, a key or a value type is one line on stderr (exit code 2) instead of
Hydra's multi-line report, and no run directory is made or changed for it. Hydra's job then
trains those same components: nothing is built twice.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import hydra
from omegaconf import DictConfig, OmegaConf

from rlcli.registry import ConfigError
from rlcli.run.compose import (
    HYDRA_FLAGS,
    HYDRA_FLAGS_WITH_VALUE,
    check_argument_style,
    check_group_choices,
    check_plugins,
    compose_config,
    conf_dir,
    explain_composition_error,
    group_with_option,
    key_of,
    schedule_args,
    unparsable,
    value_of,
    with_config_dirs,
)
from rlcli.run.resume import is_sweep_dir, resume_args


def _fail(error: Exception) -> NoReturn:
    print(f"rl-train: error: {error}", file=sys.stderr)
    raise SystemExit(2)


def env_dir_name(choice: str, env_id: str) -> str:
    """The run directory's env part: the env choice, or for env=gym the env id (`module:Env-v0` -> `module_Env-v0`)."""
    name = str(env_id) if choice == "gym" else str(choice)
    return name.replace(":", "_").replace(" ", "_")


OmegaConf.register_new_resolver("rlcli_env_dir", env_dir_name, replace=True)


# What the pre-check built for a single run, handed to Hydra's job when its config is the same.
_PREPARED: dict[str, Any] = {}


def _configkey_of(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg)


def precheck(args: list[str], keep: bool = False, warnings: list[str] | None = None) -> None:
    """Compose the config and build the run's components the way the run will, raising a one-line ConfigError.
    With `keep`, the components wait for Hydra's job (see `_hydra_entry`); otherwise they are closed, and
    collector=ray's workers are not started for them (a sweep would start Ray once per job to check it).
    `warnings`: the run's budget warnings are added to it (a sweep says them once for all its jobs)."""
    cfg = compose_config(args)  # group, key and syntax errors come here, before torch is imported
    check_env_id(cfg)
    if cfg.get("dataset") is not None:
        from rlcli.run.offline import check_early

        check_early(cfg)  # it reads, its settings, its env
    from rlcli.run.state import prepare

    # Building checks everything (ranges, env ids, devices, action spaces) and writes nothing.
    components, state = prepare(cfg, start_workers=keep)
    if warnings is not None:
        from rlcli.run.budget import budget_warnings, planned_steps

        typed = {key_of(a) for a in args if "=" in a}
        found = budget_warnings(components, planned_steps(components, state.env_steps), typed)
        warnings += [w for w in found if w not in warnings]
    if keep:
        _PREPARED.update(key=_configkey_of(cfg), prepared=(components, state))
    else:
        components.close()


def finished_run_args(args: list[str], overrides: list[str]) -> tuple[list[str], list[str]]:
    """A resume of a run that had finished (run/resume.finished_run_plan), after the pre-check: with nothing to train,
    Hydra is told to write nothing into the run's .hydra/ (the run directory is left as it was); with a raised budget
    past the stop reward that the run reached, train.stop_reward=null is added (said in one line, and recorded in
    the run's overrides) and the run is checked again. Returns (Hydra's arguments, the job's overrides)."""
    from rlcli.run.resume import DONE, PAST_STOP_REWARD, TYPED_ON_RESUME, finished_run_plan, past_stop_reward_line
    from rlcli.services.log import say

    prepared = _PREPARED.get("prepared")
    if prepared is None or not any(key_of(a) == "resume" for a in overrides):
        return args, overrides
    components, state = prepared
    total, stop_reward = components.settings.total_steps, components.stop_reward
    plan = finished_run_plan(state, total, stop_reward, TYPED_ON_RESUME)
    if plan == DONE:
        return [*args, "hydra.output_subdir=null"], overrides
    if plan == PAST_STOP_REWARD:
        say(f"rl-train: {past_stop_reward_line(state, total, stop_reward)}")
        _PREPARED.clear()
        components.close()
        off = "train.stop_reward=null"
        precheck([*overrides, off], keep=True)
        return [*args, off], [*overrides, off]
    return args, overrides


def offline_env_args(args: list[str]) -> list[str]:
    """`dataset=` without env= or env.id=: the run is tested in the dataset's env, added to the command line (so the
    run directory is named after it and a resume replays it). A relative path that exists is made absolute, so that
    a resume from another directory reads the same file. Reads the dataset (numpy only, no torch)."""
    sources = [value_of(a) for a in args if key_of(a) == "dataset"]
    if not sources or sources[-1] in ("", "null", "None") or "," in sources[-1]:
        return args
    source = sources[-1]
    # what is added goes where the dataset= override is (not after a flag's value: `--cfg job env=...` is an error)
    at = max(i for i, a in enumerate(args) if key_of(a) == "dataset")
    path = Path(source).expanduser()
    if not path.is_absolute() and path.exists():  # a relative path: absolute, so a resume from elsewhere finds it
        source = str(path.resolve())
        quoted = "'" + source.replace("\\", "\\\\").replace("'", "\\'") + "'"
        args = [*args[:at], f"dataset={quoted}", *args[at + 1:]]
    if any(key_of(a) in ("env", "env.id") for a in args if "=" in a and not a.startswith("-")):
        return args
    from rlcli.run.offline import env_choice, read

    return [*args[:at + 1], *env_choice(read(source), source, conf_dir()), *args[at + 1:]]


def check_env_id(cfg: DictConfig) -> None:
    """A wrong `env.id` is the commonest typo; gymnasium's registry answers it without importing torch."""
    if str(cfg.env.get("name", "")) == "gym":
        from rlcli.envs import resolve_env_id

        resolve_env_id(cfg.env.get("id"))


def _take_prepared(cfg: DictConfig) -> Any:
    """The pre-check's components if they were built from this very config, else None (and they are closed)."""
    prepared = _PREPARED.pop("prepared", None)
    if prepared is not None and _PREPARED.pop("key") == _configkey_of(cfg):
        return prepared
    if prepared is not None:
        prepared[0].close()
    return None


@hydra.main(version_base="1.3", config_path=conf_dir(), config_name="config")
def _hydra_entry(cfg: DictConfig) -> Any:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    if hydra_cfg.mode == RunMode.MULTIRUN:
        from rlcli.sweeps.jobs import run_job
        from rlcli.sweeps.parallel_jobs import STOPPABLE_TARGET, run_job_stoppably
        from rlcli.sweeps.ray_jobs import STOPPABLE_RAY_TARGET
        from rlcli.sweeps.tuning import trial_reporter

        job_num, overrides = int(hydra_cfg.job.num), list(hydra_cfg.overrides.task)
        target = hydra_cfg.launcher.get("_target_")
        if target in (STOPPABLE_TARGET, STOPPABLE_RAY_TARGET):  # hydra/launcher=joblib, ray, ray_cluster
            return run_job_stoppably(lambda may_train: run_job(cfg, run_dir, job_num, overrides, trial_reporter,
                                                               may_train), run_dir, job_num, overrides,
                                     in_ray_task=target == STOPPABLE_RAY_TARGET)
        return run_job(cfg, run_dir, job_num, overrides, trial_reporter)
    if _FROM_PYTHON:  # Hydra would print the run's exceptions and exit: they go back to the caller instead
        try:
            _FROM_PYTHON["trainer"] = trainer = _single_run(cfg, hydra_cfg, run_dir)
            trainer.run()
        except BaseException as error:
            _FROM_PYTHON["error"] = error
        return None
    try:
        trainer = _single_run(cfg, hydra_cfg, run_dir)
    except ConfigError as error:
        _fail(error)
    result = trainer.run()
    if cfg.get("resume") is not None:
        from rlcli.sweeps.jobs import record_job_resumed_alone

        record_job_resumed_alone(run_dir, trainer)
    return result


def _single_run(cfg: DictConfig, hydra_cfg: Any, run_dir: Path) -> Any:
    """The trainer of a single run, over the pre-check's components when they were built from this config."""
    from rlcli.run import lock as run_lock
    from rlcli.run.state import prepare
    from rlcli.run.trainer import Trainer, TrainerOptions, header_labels

    try:
        run_lock.acquire(run_dir)  # usually held since main(); a fresh directory is locked here
    except ConfigError:
        prepared = _PREPARED.pop("prepared", None)
        if prepared is not None:
            prepared[0].close()
        raise
    components, state = _take_prepared(cfg) or prepare(cfg)
    options = TrainerOptions(
        typed_keys={key_of(str(a)).lstrip("+~") for a in hydra_cfg.overrides.task},
        **header_labels(cfg, hydra_cfg.runtime.choices),
        callbacks=_FROM_PYTHON.get("callbacks", ()),
        in_python=bool(_FROM_PYTHON),
    )
    return Trainer(components, run_dir, state, options)


# The Python API's run (api.py): its callbacks in, and the trainer (or what stopped it) out of Hydra's job.
_FROM_PYTHON: dict[str, Any] = {}


def run_from_python(argv: list[str], callbacks: Sequence[Any] = ()) -> Any:
    """What `rl-train <argv>` does, for rlcli.train(): the same checks, the same run directory and the same
    loop, with bad input raised as ConfigError and the run's own exceptions raised here, never printed and
    exited on. Returns the trainer after its run; the run directory's lock is released."""
    from rlcli.run import lock as run_lock

    args = schedule_args(list(argv))
    flags = [a for a in args if a.startswith("-")]
    if flags:
        raise ConfigError(f"{flags[0]!r} is a command-line flag; rlcli.train() takes key=value overrides only")
    check_argument_style(args, "rlcli.train", (), (), group_with_option)
    args = offline_env_args(resume_args(args))
    try:
        lock_existing_run_dir(args)
        check_writable(args, multirun=False)
        precheck(args, keep=True)
        args, _ = finished_run_args(args, args)
    except BaseException:  # this process goes on: the run directory it locked is free again
        for run_dir in [value_of(a) for a in args if key_of(a) == "hydra.run.dir"]:
            run_lock.release(Path(run_dir).expanduser())
        raise
    saved_argv = sys.argv
    _FROM_PYTHON.update(callbacks=list(callbacks))
    sys.argv = ["rl-train", *args]
    try:
        _hydra_entry()
    finally:
        sys.argv = saved_argv
        outcome = dict(_FROM_PYTHON)
        _FROM_PYTHON.clear()
        _PREPARED.clear()
    trainer = outcome.get("trainer")
    if trainer is not None:
        run_lock.release(trainer.run_dir)
    if "error" in outcome:
        raise outcome["error"]
    if trainer is None:
        raise ConfigError("the run did not start (Hydra gave no job)")
    return trainer


def precheck_sweep(args: list[str]) -> tuple[str, bool]:
    """`-m`: check every job's config (each swept value, each end of a search space) before launching. Returns
    the launcher's `_target_`, and whether the jobs' budget warnings were said here, once for the whole sweep (its
    jobs then write them to their train.log only: main sets budget.SAID_BY_SWEEP for them; a search's jobs say
    their own). This process's environment is left as it was."""
    from hydra import compose, initialize_config_dir

    from rlcli.sweeps.jobs import probe_combinations, search_space_probes

    resume = [value_of(a) for a in args if key_of(a) == "resume"]
    if resume and resume[-1] not in ("auto", "null", "None", ""):
        raise ConfigError(f"resume={resume[-1]!r} cannot apply to a sweep; finish a killed sweep with the same "
                          "command plus resume=auto hydra.sweep.dir=<its directory>")
    if resume and resume[-1] == "auto" and not any(key_of(a) == "hydra.sweep.dir" for a in args):
        raise ConfigError("resume=auto with -m needs hydra.sweep.dir=<the sweep's directory> so that it finds the "
                          "jobs of the killed sweep")
    auto = bool(resume) and resume[-1] == "auto"
    sweep_dirs = [value_of(a) for a in args if key_of(a) == "hydra.sweep.dir"]
    root = Path(sweep_dirs[-1]) if sweep_dirs and sweep_dirs[-1] else None  # as Hydra takes it: `~` unexpanded
    if root is not None and any((root / "checkpoints").glob("ckpt_*.pt")):
        raise ConfigError(f"hydra.sweep.dir={sweep_dirs[-1]} is a trained run's directory (checkpoints/), not a "
                          "sweep's: choose another hydra.sweep.dir")
    check_plugins(args)
    args = [a for a in args if key_of(a) != "resume"]
    hydra_args = [a for a in args if key_of(a).startswith(("hydra.", "hydra/"))]
    job_args = [a for a in args if a not in hydra_args]
    try:
        combos = probe_combinations(job_args)
    except Exception as error:  # Hydra's override grammar: name the argument that does not parse
        raise ConfigError(unparsable(error, job_args)) from None
    check_group_choices([a for combo in combos for a in combo])
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3", job_name="train"):
        try:
            full = compose("config", overrides=[*combos[0], *hydra_args], return_hydra_config=True)
        except Exception as error:
            raise ConfigError(explain_composition_error(error, [*combos[0], *hydra_args])) from None
    launcher = full.hydra.launcher
    if "rlcli_population_launcher" in str(launcher.get("_target_", "")):
        from rlcli.sweeps.population.launch import check_launcher_options

        check_launcher_options(launcher.get("max_members"), launcher.get("n_jobs"))
    sweeper = full.hydra.sweeper
    ours = "rlcli" in str(sweeper.get("_target_", "")) and sweeper.get("params")
    probes = search_space_probes(OmegaConf.to_container(sweeper.params)) if ours else []
    if root is not None:
        numbered = OmegaConf.to_container(full.hydra.sweep, resolve=False).get("subdir") == "${hydra.job.num}"
        check_sweep_dir(root, sweep_dirs[-1], auto, numbered, job_args if auto and not ours else None)
    built: set[tuple[str, ...]] = set()
    # the jobs' budget warnings, said once here for the whole sweep (not for a search space's sampled jobs)
    warnings: list[str] | None = None if ours else []
    for number, combo in enumerate([*combos, *([*combos[0], probe] for probe in probes)]):
        rest = tuple(a for a in combo if key_of(a) != "seed")
        if rest in built and _plain_seed(combo):
            continue  # a job already built but for a valid seed: building it again checks nothing new
        precheck(combo, warnings=warnings if number < len(combos) else None)
        built.add(rest)
    if warnings is not None:  # None: a search's jobs say their own
        from rlcli.services.log import say

        for warning in warnings:
            say(f"rl-train: warning: {warning}")
    return str(launcher.get("_target_", "")), warnings is not None


def check_sweep_dir(root: Path, named: str, auto: bool, numbered: bool, job_args: list[str] | None) -> None:
    """A new sweep whose jobs' directories hold trained runs would start each afresh over them (Hydra reuses them):
    one line unless resume=auto finishes the sweep, and with resume=auto, one line where the trained jobs sit where
    this command's jobs would not look (another hydra.sweep.subdir). `numbered`: the jobs' dirs are their numbers
    (hydra.sweep.subdir's default); `job_args`: the command's job overrides, to compare the jobs with the sweep's."""
    trained = trained_dirs(root)
    ours = is_sweep_dir(root)  # a sweep's directory; else only the numbered dirs these jobs would write collide
    colliding = trained if ours or not numbered else [t for t in trained if t.isdigit()]
    if colliding and not auto:
        raise ConfigError(f"hydra.sweep.dir={named} already holds a sweep's trained jobs ({_some(colliding)}): "
                          "resume=auto with the command that started it finishes it; for a new sweep, choose "
                          "another hydra.sweep.dir")
    if auto and job_args is not None:
        check_same_jobs(root, job_args)
        if numbered and ours and (stray := [t for t in trained if not t.isdigit()]):
            raise ConfigError(f"resume=auto: {named}'s trained jobs are at {_some(stray)}, where this command's jobs "
                              "(hydra.sweep.subdir: their numbers) would not look: give the hydra.sweep.subdir that "
                              "started the sweep")


def trained_dirs(root: Path) -> list[str]:
    """The directories below `root` that hold a trained run (a checkpoint), relative to it."""
    return sorted({str(c.parent.parent.relative_to(root)) for c in root.glob("*/**/checkpoints/ckpt_*.pt")})


def _some(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def check_same_jobs(sweep_dir: Path, job_args: list[str]) -> None:
    """resume=auto finishes a sweep with the command that started it: a job directory whose record (status.json)
    names other overrides than this command's job of that number is one line, before anything is written (Hydra
    would rewrite the job's saved config, and a completed job would be skipped under the new command's name).
    Settings a resume may change (run/resume.py's CHANGEABLE: the budget, logging, device) may differ."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from rlcli.run.resume import CHANGEABLE
    from rlcli.sweeps.jobs import as_typed, probe_combinations, read_status

    parser = OverridesParser.create()

    def same_job(overrides: Sequence[str]) -> list[str]:
        """The job's overrides as Hydra reads them (`true` and `True`, `1e-3` and `0.001` alike; a key given twice:
        its last value), in one order."""
        kept = [o for o in overrides if not key_of(o).lstrip("+~").startswith((*CHANGEABLE, "hydra.", "sweep.trial"))]
        values = {o.get_key_element(): o.get_value_element_as_str() for o in parser.parse_overrides(kept)}
        return sorted(as_typed(f"{key}={value}") for key, value in values.items())  # (as_typed: for the line)

    for number, combo in enumerate(probe_combinations(job_args, limit=100_000)):
        record = read_status(sweep_dir / str(number))
        if record is None or not isinstance(record.get("overrides"), list):
            continue  # not started, or not a job rlcli wrote
        before, now = same_job(record["overrides"]), same_job(combo)
        if before != now:
            raise ConfigError(f"resume=auto: job {number} of {sweep_dir} ran {' '.join(before) or 'the defaults'}, "
                              f"this command's job {number} is {' '.join(now) or 'the defaults'}; finish a sweep with "
                              "the command that started it plus resume=auto (a new sweep: another hydra.sweep.dir)")
        check_budget_not_passed(sweep_dir / str(number), number, record, combo)


def check_budget_not_passed(job_dir: Path, number: int, record: dict[str, Any], combo: Sequence[str]) -> None:
    """A stopped job that resume=auto would finish at a typed budget below both the steps it has taken and its own
    (run/resume.budget_passed's rule for a single run): one line before any job runs, not jobs finished short."""
    from rlcli.run.resume import saved_setting
    from rlcli.sweeps.jobs import DONE

    typed = [value_of(a) for a in combo if key_of(a) == "train.total_steps"]
    newest = sorted((job_dir / "checkpoints").glob("ckpt_*.pt"))
    try:  # as Hydra reads it: 100_000, +5000 and 1e5 are numbers too
        budget = int(float(typed[-1].replace("_", ""))) if typed else None
    except ValueError:
        budget = None
    if record.get("status") in DONE or budget is None or not newest:
        return
    own = saved_setting(job_dir, "train", "total_steps")
    digits = newest[-1].stem.removeprefix("ckpt_")  # checkpoints are named by their env steps
    steps = int(digits) if digits.isdigit() else 0
    if isinstance(own, int) and budget < own and steps > budget:
        raise ConfigError(f"resume=auto: job {number} of {job_dir.parent} stopped at {steps:,} env steps, and "
                          f"train.total_steps={budget:,} is below that and below its own {own:,}: nothing was run; "
                          f"finish the sweep without the lower train.total_steps (a job stopped past a budget is "
                          f"finished where it is by rl-train resume={job_dir} train.total_steps={steps})")


def _plain_seed(combo: list[str]) -> bool:
    """The combo's seed is a plain integer in numpy's range (what build.py's check accepts)."""
    seeds = [value_of(a) for a in combo if key_of(a) == "seed"]
    return bool(seeds) and seeds[-1].isascii() and seeds[-1].isdigit() and int(seeds[-1]) < 2**32


def start_population_workers_early(args: list[str]) -> None:
    """`hydra/launcher=population` that will likely train in worker processes: their fork server starts now, and
    imports what they need while this process checks the sweep (sweeps/population/workers.start_worker_server)."""
    chosen = {key_of(a): value_of(a) for a in args if "=" in a}
    if chosen.get("hydra/launcher") != "population":
        return
    from rlcli.sweeps.population import workers

    if workers.may_start_early(chosen.get("hydra.launcher.n_jobs", "auto"), chosen.get("device", "auto")):
        workers.start_worker_server(chosen.get("compile", "false").lower() == "true")


def with_stoppable_launcher(args: list[str], launcher: str) -> list[str]:
    """`hydra/launcher=joblib` and `ray` (`ray_cluster`) run as rlcli's subclasses of Hydra's plugins
    (sweeps/parallel_jobs.py, sweeps/ray_jobs.py: Ctrl-C and SIGTERM stop their jobs with checkpoints, and the
    waiting jobs do not start); every option of the plugin stays."""
    from rlcli.sweeps.parallel_jobs import JOBLIB_TARGET, STOPPABLE_TARGET
    from rlcli.sweeps.ray_jobs import RAY_TARGET, STOPPABLE_RAY_TARGET

    ours = {JOBLIB_TARGET: STOPPABLE_TARGET, RAY_TARGET: STOPPABLE_RAY_TARGET}.get(launcher)
    return args if ours is None else [*args, f"hydra.launcher._target_={ours}"]


def lock_existing_run_dir(args: list[str]) -> None:
    """A resumed or re-queued run's directory is locked before anything reads or writes it (run/lock.py)."""
    run_dirs = [value_of(a) for a in args if key_of(a) == "hydra.run.dir"]
    check_dir_path(args, multirun=False)  # not the working directory for an empty value, nor a file
    if run_dirs and Path(run_dirs[-1]).expanduser().is_dir():
        from rlcli.run import lock as run_lock

        run_lock.acquire(Path(run_dirs[-1]).expanduser())


def check_dir_path(args: list[str], multirun: bool) -> Path:
    """The run (or sweep) directory the command line names, refused in one line when it cannot be one: empty (the
    run's files would land in the working directory itself), a file, or under a file. Returns it, absolute."""
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    given = [value_of(a) for a in args if key_of(a) == key]
    if given and given[-1].strip().strip("'\"").strip() in ("", "null", "None"):
        kind = "sweep" if multirun else "run"
        raise ConfigError(f"{key}={given[-1]!r} is invalid: an empty path would write the {kind}'s files into the "
                          f"working directory itself; give a directory path ({key}=. if that is what you mean)")
    target = Path(given[-1]).expanduser().absolute() if given else Path.cwd()
    existing = next((p for p in (target, *target.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        where = "is a file" if existing == target else f"is under {existing}, which is a file, not a directory"
        raise ConfigError(f"{key}={given[-1] if given else target} is invalid: it {where}; set {key}=<a directory>")
    return target


def check_writable(args: list[str], multirun: bool) -> None:
    """Where Hydra will make the run (or sweep) directory must be writable: else one line, before anything runs."""
    import errno
    import os

    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    kind = "sweep" if multirun else "run"
    target = check_dir_path(args, multirun)
    existing = next((p for p in (target, *target.parents) if p.exists()), None)
    if existing is None or (os.access(existing, os.W_OK) and os.access(existing, os.X_OK)):
        return
    try:  # access() says no: say why (a read-only file system, or permissions)
        os.close(os.open(existing / ".rlcli-write-probe", os.O_CREAT | os.O_WRONLY, 0o600))
        (existing / ".rlcli-write-probe").unlink()
    except OSError as error:
        why = "a read-only file system" if error.errno == errno.EROFS else (error.strerror or str(error)).lower()
        raise ConfigError(f"cannot write the {kind} directory under {existing}: {why}; run "
                          f"from a writable directory or set {key}=<a writable path>") from None


def main(argv: list[str] | None = None) -> None:
    """Console entry point of `rl-train`. What a sweep sets in the environment for its jobs (budget.SAID_BY_SWEEP:
    the basic launcher's jobs run in this process, joblib's and the population launcher's workers inherit it) is
    put back at the end, for a caller that goes on in this process."""
    import os

    environ_before = dict(os.environ)
    try:
        _main(argv)
    finally:
        # only a sweep sets it, after importing budget; importing budget here would import torch before a config
        # error could be said
        budget = sys.modules.get("rlcli.run.budget")
        if budget is not None:
            name = budget.SAID_BY_SWEEP
            if name in environ_before:
                os.environ[name] = environ_before[name]
            else:
                os.environ.pop(name, None)


def _say_misplaced_dirs(args: list[str], multirun: bool) -> None:
    """hydra.run.dir on a -m sweep, or hydra.sweep.dir on one run, is not used: Hydra ignores it without a word."""
    if any(a.startswith("-") and a not in ("-m", "--multirun") for a in args):
        return  # --help, --cfg: nothing runs
    unused = "hydra.run.dir" if multirun else "hydra.sweep.dir"
    for arg in (a for a in args if key_of(a) == unused):
        where = "a -m sweep's jobs go under hydra.sweep.dir (multirun/<time> by default)" if multirun else \
            "this command is one run, in hydra.run.dir (runs/<algo>/<env>/<time> by default); add -m for a sweep"
        print(f"rl-train: warning: {arg} is not used: {where}", file=sys.stderr)


def _main(argv: list[str] | None) -> None:
    args = schedule_args(list(sys.argv[1:] if argv is None else argv))
    multirun = any(a in ("-m", "--multirun") for a in args)
    try:
        check_argument_style(args, "rl-train", HYDRA_FLAGS, HYDRA_FLAGS_WITH_VALUE, group_with_option)
        _say_misplaced_dirs(args, multirun)
        if multirun:
            import os

            from rlcli.run.budget import SAID_BY_SWEEP

            if not any(key_of(a) in ("hparams_search", "hydra/sweeper") for a in args if "=" in a):
                # precheck_sweep says the jobs' budget warnings once; set before the population's workers start
                os.environ[SAID_BY_SWEEP] = "1"
            args = offline_env_args(args)
            start_population_workers_early(args)
            launcher, said = precheck_sweep([a for a in args if not a.startswith("-")])
            if said:  # the jobs write their budget warnings to their train.log only
                os.environ[SAID_BY_SWEEP] = "1"
            else:  # a search's jobs say their own
                os.environ.pop(SAID_BY_SWEEP, None)
            check_writable(args, multirun=True)
            args = with_stoppable_launcher(args, launcher)
        else:
            for launcher in (a for a in args if key_of(a).lstrip("+~") == "hydra/launcher"
                             and not any(flag.startswith("-") for flag in args)):  # not --help, --cfg
                print(f"rl-train: warning: {launcher} launches the jobs of a -m sweep; without -m this command is one "
                      f"run and no launcher is used: add -m (rl-train -m {launcher} seed=0,1,2 ...)",
                      file=sys.stderr)
            args = offline_env_args(resume_args(args))
            lock_existing_run_dir(args)
            overrides = with_config_dirs(args)
            if overrides is not None:  # other flags (--help, --cfg, --info) go straight to Hydra
                check_writable(args, multirun=False)
                precheck(overrides, keep=True)
                args, overrides = finished_run_args(args, overrides)
    except ConfigError as error:
        _fail(error)
    sys.argv = [sys.argv[0], *args]
    _hydra_entry()
    if multirun:
        from rlcli.sweeps.jobs import failed_jobs

        if failed_jobs:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
