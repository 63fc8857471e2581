"""Hyperparameter search with Optuna, as a Hydra sweeper that can prune (`hydra/sweeper=rlcli_optuna`).

Hydra's own Optuna sweeper pins optuna<3 and only ever sees a job's final value, so it cannot prune.
This sweeper asks Optuna for a batch of trials, launches one job per (trial, seed) through whatever
Hydra launcher is configured (basic, joblib, Ray), and tells Optuna each trial's objective: the mean
or interquartile mean of its jobs' final test returns. Jobs report every test return to the trial
as it happens (`sweep.trial` points them at the study), and a job whose trial the pruner judges
hopeless stops early. The study lives in a journal file in the sweep directory, so running the same
command again with `resume=auto` continues it: finished trials count, trials that were running when
the sweep was killed are run again (their jobs resume from checkpoints), then new trials are asked.
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from rlcli.registry import ConfigError
from rlcli.run.callbacks import Callback, RunContext, StopRequest

logger = logging.getLogger("rlcli")
JOURNAL = "optuna.journal"


def iqm(values: list[float] | np.ndarray) -> float:
    """Interquartile mean: drop the lowest and highest 25% (int(0.25 n) of each), average the rest."""
    x = np.sort(np.asarray(values, dtype=float))
    cut = int(0.25 * len(x))
    return float(x[cut:len(x) - cut].mean())


def aggregate(values: list[float], objective: str) -> float:
    return iqm(values) if objective == "iqm" else float(np.mean(values))


# ---------------------------------------------------------------------------------- search space
@dataclass
class Dist:
    """One searched parameter: `choice(a,b)`, `interval(lo,hi)`, `tag(log, interval(lo,hi))`,
    `int(interval(lo,hi))` or `range(start,stop,step)` in Hydra's override grammar."""

    key: str
    choices: list[Any] = field(default_factory=list)
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False
    integer: bool = False

    def to_optuna(self) -> Any:
        import optuna.distributions as d

        if self.choices:
            return d.CategoricalDistribution(self.choices)
        if self.integer:
            return d.IntDistribution(int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return d.FloatDistribution(float(self.low), float(self.high), log=self.log, step=self.step)

    def probe_values(self) -> list[Any]:
        """The values a pre-launch check tries: every choice, or both ends."""
        return list(self.choices) if self.choices else [self.low, self.high]


def parse_search_space(params: dict[str, Any]) -> dict[str, Dist]:
    """`hydra.sweeper.params` -> distributions; a value that does not parse is a one-line error."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep

    parser = OverridesParser.create()
    space = {}
    for key, text in (params or {}).items():
        try:
            value = parser.parse_override(f"{key}={text}").value()
        except Exception as error:
            raise ConfigError(f"hydra.sweeper.params.{key}={text!r} does not parse ({str(error).splitlines()[0]}); "
                              "use choice(a,b), interval(lo,hi), tag(log,interval(lo,hi)), int(interval(lo,hi)) "
                              "or range(start,stop,step)") from None
        if isinstance(value, ChoiceSweep):
            space[key] = Dist(key, choices=list(value.list))
        elif isinstance(value, RangeSweep):
            values = list(np.arange(value.start, value.stop, value.step))
            space[key] = Dist(key, choices=[v.item() for v in values])
        elif isinstance(value, IntervalSweep):
            integer = isinstance(value.start, int) and isinstance(value.end, int)
            if not value.start < value.end:
                raise ConfigError(f"hydra.sweeper.params.{key}={text!r}: the interval is empty")
            space[key] = Dist(key, low=value.start, high=value.end, log="log" in value.tags, integer=integer)
        else:  # a fixed value: searched over a single choice
            space[key] = Dist(key, choices=[value])
    return space


def _value_arg(key: str, value: Any) -> str:
    if isinstance(value, float):
        return f"{key}={value!r}"
    if isinstance(value, str) and any(c in value for c in " ,()[]{}:'\"="):
        return f"{key}='{value}'"
    return f"{key}={value}"


# ---------------------------------------------------------------------------------- storage
def open_study(journal: Path, name: str, sampler: Any = None, pruner: Any = None) -> Any:
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    storage = JournalStorage(JournalFileBackend(str(journal)))
    return optuna.create_study(storage=storage, study_name=name, sampler=sampler, pruner=pruner,
                               direction="maximize", load_if_exists=True)


def make_pruner(name: str, startup_trials: int, warmup_steps: int) -> Any:
    import optuna

    if name == "none":
        return optuna.pruners.NopPruner()
    return optuna.pruners.MedianPruner(n_startup_trials=startup_trials, n_warmup_steps=warmup_steps)


def trial_reporter(cfg: DictConfig) -> Callback | None:
    """The pruning callback a sweep job gets: each test return goes to its trial, and the trial may stop the job."""
    pointer = cfg.get("sweep", {}).get("trial")
    if not pointer or not pointer.get("report", False):
        return None
    import optuna

    # Optuna keeps no pruner in its storage: the job builds the sweeper's from the pointer.
    pruner = make_pruner(str(pointer.get("pruner", "median")), int(pointer.get("startup", 2)),
                         int(pointer.get("warmup", 0)))
    study = open_study(Path(str(pointer.journal)), str(pointer.study), pruner=pruner)
    trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, int(pointer.number))
    return TrialPruning(optuna.trial.Trial(study, trial_id), int(pointer.number))


class TrialPruning(Callback):
    """Reports each test return to the job's Optuna trial; stops the job ("pruned") when the pruner says so."""

    def __init__(self, trial: Any, number: int) -> None:
        self.trial, self.number = trial, number

    def after_test(self, run: RunContext, result: Any) -> StopRequest:
        state = run.state
        if state.last_test_return is None or not math.isfinite(state.last_test_return):
            return None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a resumed job reports steps it reported before
                self.trial.report(float(state.last_test_return), int(state.env_steps))
            return "pruned" if self.trial.should_prune() else None
        except Exception as error:  # the trial was closed by the sweeper: keep training, stop reporting
            logger.warning("optuna trial %s: %s", self.number, error)
            return None


# ---------------------------------------------------------------------------------- the sweeper
class OptunaSweep:
    """The sweep loop; `hydra_plugins.rlcli_optuna_sweeper` wraps it as a Hydra Sweeper plugin."""

    def __init__(self, n_trials: int, n_jobs: int, sampler: str, seed: int | None, pruner: str,
                 pruner_startup_trials: int, pruner_warmup_steps: int, study_name: str,
                 params: dict[str, Any] | None) -> None:
        for key, value, rule in (("n_trials", n_trials, n_trials > 0), ("n_jobs", n_jobs, n_jobs > 0)):
            if not rule:
                raise ConfigError(f"hydra.sweeper.{key}={value} must be > 0")
        if sampler not in ("tpe", "random"):
            raise ConfigError(f"hydra.sweeper.sampler={sampler!r} is not known; choose from: tpe, random")
        if pruner not in ("median", "none"):
            raise ConfigError(f"hydra.sweeper.pruner={pruner!r} is not known; choose from: median, none")
        self.n_trials, self.n_jobs, self.study_name = n_trials, n_jobs, study_name
        self.sampler_name, self.seed, self.pruner_name = sampler, seed, pruner
        self.pruner_startup_trials, self.pruner_warmup_steps = pruner_startup_trials, pruner_warmup_steps
        self.params = dict(params or {})

    def setup(self, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.config = config
        self.hydra_context = hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config)
        sweep_cfg = config.get("sweep") or {}
        seeds = sweep_cfg.get("seeds")
        self.seeds = [int(s) for s in seeds] if seeds else [int(config.seed)]
        self.objective = str(sweep_cfg.get("objective", "mean"))
        if self.objective not in ("mean", "iqm"):
            raise ConfigError(f"sweep.objective={self.objective!r} is not known; choose from: mean, iqm")

    def _make_samplers(self) -> tuple[Any, Any]:
        import optuna

        sampler = (optuna.samplers.RandomSampler(seed=self.seed) if self.sampler_name == "random"
                   else optuna.samplers.TPESampler(seed=self.seed))
        return sampler, make_pruner(self.pruner_name, self.pruner_startup_trials, self.pruner_warmup_steps)

    def _split(self, arguments: list[str]) -> tuple[list[str], dict[str, Any]]:
        """Command-line sweeps (`algo.lr=1e-3,3e-4`) join the search space as choices; a swept
        `seed=0,1,2` sets the seeds every trial runs; the jobs' `seed=` is always the sweeper's."""
        from hydra.core.override_parser.overrides_parser import OverridesParser

        fixed, params = [], dict(self.params)
        for override in OverridesParser.create().parse_overrides(arguments):
            key = override.get_key_element()
            if key == "seed":
                if override.is_sweep_override():
                    self.seeds = [int(s) for s in override.sweep_string_iterator()]
            elif override.is_sweep_override():  # a,b / choice() / range() / interval() / tag(log, ...)
                params[key] = override.input_line.split("=", 1)[1]
            else:
                fixed.append(override.input_line)
        return fixed, params

    def _jobs(self, trial: Any, fixed: list[str], space: dict[str, Dist], journal: Path) -> list[list[str]]:
        searched = [_value_arg(key, trial.params[key]) for key in space]
        jobs = []
        for i, seed in enumerate(self.seeds):
            pointer = (f"sweep.trial={{journal:'{journal}',study:{self.study_name},number:{trial.number},"
                       f"report:{'true' if i == 0 else 'false'},pruner:{self.pruner_name},"
                       f"startup:{self.pruner_startup_trials},warmup:{self.pruner_warmup_steps}}}")
            jobs.append([*fixed, *searched, f"seed={seed}", pointer])
        return jobs

    def sweep(self, arguments: list[str]) -> Any:
        import optuna
        from optuna.trial import TrialState

        sweep_dir = Path(str(self.config.hydra.sweep.dir)).resolve()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        fixed, params = self._split(arguments)
        space = parse_search_space(params)
        if not space:
            raise ConfigError("hydra/sweeper=rlcli_optuna has nothing to search: set hydra.sweeper.params "
                              "(or use +hparams_search=<file> from conf/hparams_search/)")
        distributions = {key: dist.to_optuna() for key, dist in space.items()}
        sampler, pruner = self._make_samplers()
        journal = sweep_dir / JOURNAL
        study = open_study(journal, self.study_name, sampler, pruner)
        finished = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)

        # Trials left running by a killed sweep run again (their jobs resume from checkpoints).
        stale = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING]
        for frozen in stale:
            trial = optuna.trial.Trial(study, frozen._trial_id)
            logger.info("optuna: trial %d was interrupted; running it again", frozen.number)
            self._run_batch(study, [trial], fixed, space, journal)

        while True:
            done = sum(t.state in finished for t in study.get_trials(deepcopy=False))
            if done >= self.n_trials:
                break
            trials = [study.ask(distributions) for _ in range(min(self.n_jobs, self.n_trials - done))]
            self._run_batch(study, trials, fixed, space, journal)
        return self._finish(study, sweep_dir)

    def _run_batch(self, study: Any, trials: list[Any], fixed: list[str], space: dict[str, Dist],
                   journal: Path) -> None:
        from optuna.trial import TrialState

        n = len(self.seeds)
        # Job directories are numbered trial * seeds + seed index, so a resumed sweep finds its jobs again.
        groups: list[tuple[int, list[list[str]]]] = []
        for trial in sorted(trials, key=lambda t: t.number):
            jobs = self._jobs(trial, fixed, space, journal)
            start = trial.number * n
            if groups and groups[-1][0] + len(groups[-1][1]) == start:
                groups[-1][1].extend(jobs)
            else:
                groups.append((start, jobs))
        returns = []
        for start, jobs in groups:
            self.validate_batch_is_legal(jobs)
            returns.extend(self.launcher.launch(jobs, initial_job_idx=start))
        by_trial = {t.number: returns[i * n:(i + 1) * n] for i, t in enumerate(sorted(trials, key=lambda t: t.number))}
        for trial in trials:
            records = []
            for job in by_trial[trial.number]:
                try:
                    records.append(job.return_value)
                except Exception as error:  # a launcher-level failure (the job itself never raises)
                    records.append({"status": "failed", "error": str(error)})
            statuses = [r.get("status") if isinstance(r, dict) else "failed" for r in records]
            finals = [r.get("final_test_return") for r in records if isinstance(r, dict)]
            if "pruned" in statuses:
                study.tell(trial, state=TrialState.PRUNED)
                logger.info("optuna: trial %d pruned", trial.number)
            elif any(s != "completed" for s in statuses) or any(f is None for f in finals):
                study.tell(trial, state=TrialState.FAIL)
                logger.warning("optuna: trial %d failed (%s)", trial.number, ", ".join(map(str, statuses)))
            else:
                value = aggregate([float(f) for f in finals], self.objective)
                study.tell(trial, value)
                logger.info("optuna: trial %d -> %s %.2f over seeds %s", trial.number, self.objective, value,
                            self.seeds)

    def validate_batch_is_legal(self, batch: list[list[str]]) -> None:
        for overrides in batch:
            self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))

    def _finish(self, study: Any, sweep_dir: Path) -> Any:
        from optuna.trial import TrialState

        from rlcli.services.log import console

        trials = study.get_trials(deepcopy=False)
        complete = [t for t in trials if t.state == TrialState.COMPLETE]
        counts = {s.name.lower(): sum(t.state == s for t in trials)
                  for s in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)}
        result: dict[str, Any] = {"study": self.study_name, "objective": self.objective, "seeds": self.seeds,
                                  "trials": counts}
        if complete:
            best = study.best_trial
            result.update(best_trial=best.number, best_value=best.value, best_params=dict(best.params))
            console.print(f"optuna: best trial {best.number}: {self.objective} test return {best.value:.2f} with "
                          + " ".join(_value_arg(k, v) for k, v in best.params.items())
                          + f"  ({counts['complete']} complete, {counts['pruned']} pruned, {counts['fail']} failed)",
                          highlight=False)
        else:
            console.print("optuna: no trial completed", highlight=False)
        OmegaConf.save(OmegaConf.create(result), sweep_dir / "optimization_results.yaml")
        return result
