"""Hydra discovers this module (namespace package `hydra_plugins`); the work is in rlcli.sweeps.tuning.

Importing it stays cheap: optuna is imported only when a sweep runs. No `from __future__ import
annotations` here: Hydra executes plugin modules outside sys.modules, where dataclasses need real types.
"""

from dataclasses import dataclass, field
from typing import Any  # noqa: UP035  (OmegaConf structured configs)

from hydra.core.config_store import ConfigStore
from hydra.plugins.sweeper import Sweeper
from omegaconf import DictConfig


@dataclass
class RlcliOptunaSweeperConf:
    _target_: str = "hydra_plugins.rlcli_optuna_sweeper.rlcli_optuna_sweeper.RlcliOptunaSweeper"
    n_trials: int = 20            # trials to finish (complete, pruned or failed)
    n_jobs: int = 1               # trials launched together (parallel with the joblib or Ray launcher)
    sampler: str = "tpe"          # tpe | random
    seed: int | None = None       # the sampler's seed
    pruner: str = "median"        # median | none
    pruner_startup_trials: int = 2   # trials finished before the pruner may prune
    pruner_warmup_steps: int = 0     # env steps before a trial may be pruned
    study_name: str = "rlcli"
    params: dict[str, Any] = field(default_factory=dict)  # key: choice(...) | interval(...) | ...


ConfigStore.instance().store(group="hydra/sweeper", name="rlcli_optuna", node=RlcliOptunaSweeperConf,
                             provider="rlcli")


class RlcliOptunaSweeper(Sweeper):
    def __init__(self, **settings: Any) -> None:
        from rlcli.sweeps.tuning import OptunaSweep

        self.sweep_impl = OptunaSweep(**settings)

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        self.sweep_impl.setup(hydra_context, task_function, config)

    def sweep(self, arguments: list[str]) -> Any:
        return self.sweep_impl.sweep(arguments)
