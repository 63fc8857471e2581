"""`hydra/launcher=population`: a sweep's seeds (and batchable hyperparameters) trained as batched populations."""


from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, configure_log, setup_globals
from hydra.plugins.launcher import Launcher
from omegaconf import DictConfig


@dataclass
class PopulationLauncherConf:
    _target_: str = "hydra_plugins.rlcli_population_launcher.population_launcher.PopulationLauncher"
    max_members: int = 64  # jobs per population; more start another population after it
    # populations trained at once, each in its own process (a big population is split); auto: on a CPU one per
    # core (and at most one per job), on a GPU one
    n_jobs: Any = "auto"


ConfigStore.instance().store(group="hydra/launcher", name="population", node=PopulationLauncherConf,
                             provider="rlcli")


class PopulationLauncher(Launcher):
    def __init__(self, max_members: int = 64, n_jobs: int | str = "auto") -> None:
        from rlcli.sweeps.population.launch import check_launcher_options

        check_launcher_options(max_members, n_jobs)  # rl-train checked them before Hydra started
        self.max_members, self.n_jobs = max_members, n_jobs
        self.config: DictConfig | None = None
        self.hydra_context: Any = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        from rlcli.sweeps.population.launch import compose_each_job_once

        self.config, self.hydra_context = config, hydra_context  # the task is rlcli's own: rl-train's function unused
        compose_each_job_once(hydra_context.config_loader)  # the sweeper's check composes them first

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from rlcli.sweeps.population.launch import launch

        setup_globals()
        assert self.config is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        return launch(self.hydra_context, self.config, job_overrides, initial_job_idx, self.max_members, self.n_jobs)
