"""Which batched update a population's algorithm takes: the on-policy family's, the value-based off-policy one's
(DQN, QR-DQN, C51), the soft actor-critics' (SAC, TQC) or the deterministic ones' (TD3, DDPG); anything else is refused
in one line naming what can batch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlcli.registry import ConfigError
from rlcli.sweeps.population.offpolicy import BatchableGradientSteps, OffPolicyPopulationUpdate
from rlcli.sweeps.population.onpolicy import BatchableUpdate, PopulationUpdate
from rlcli.sweeps.population.soft_actor_critic import BatchableSoftActorCritic, SoftActorCriticPopulationUpdate
from rlcli.sweeps.population.twin_delayed import BatchableTwinDelayed, TwinDelayedPopulationUpdate

Population = (PopulationUpdate | OffPolicyPopulationUpdate | SoftActorCriticPopulationUpdate
              | TwinDelayedPopulationUpdate)
BATCHED = "ppo, a2c, pg, dqn, qrdqn, c51, sac, tqc, td3, ddpg"


def population_update(algos: Sequence[Any], storages: Sequence[Any]) -> Population:
    """The members' batched update, or a ConfigError saying in one line why these members cannot batch."""
    kinds = {type(a) for a in algos}
    if len(kinds) > 1:
        raise ConfigError(f"the members run different algorithms ({sorted(k.__name__ for k in kinds)})")
    algo = algos[0]
    if isinstance(algo, BatchableUpdate):
        return PopulationUpdate(algos)
    if isinstance(algo, BatchableGradientSteps):
        return OffPolicyPopulationUpdate(algos, storages)
    if isinstance(algo, BatchableSoftActorCritic):
        return SoftActorCriticPopulationUpdate(algos, storages)
    if isinstance(algo, BatchableTwinDelayed):
        return TwinDelayedPopulationUpdate(algos, storages)
    raise ConfigError(f"{type(algo).__name__} cannot train in a population yet: {BATCHED} can")
