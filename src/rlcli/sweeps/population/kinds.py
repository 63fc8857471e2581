"""Whether a population's algorithm can batch, as its registered spec declares (`AlgoSpec.population`): every kind
(on-policy: PPO, A2C, PG, PQN; off-policy: DQN, QR-DQN, C51, SAC, TQC, CrossQ, TD3, DDPG and the offline ones) is
written for a runner and runs as one lockstep population; anything else is refused in one line naming what can batch
(sweeps/population/catalog.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlcli.registry import ConfigError
from rlcli.sweeps.population.catalog import can_batch, declared_kind
from rlcli.sweeps.population.lockstep import LockstepPopulation

Population = LockstepPopulation


def population_update(algos: Sequence[Any], storages: Sequence[Any]) -> Population:
    """The members' batched update, or a ConfigError saying in one line why these members cannot batch."""
    kinds = {type(a) for a in algos}
    if len(kinds) > 1:
        raise ConfigError(f"the members run different algorithms ({sorted(k.__name__ for k in kinds)})")
    kind = declared_kind(algos[0])  # the algorithm's spec says which (each update checks the members' shape)
    if kind in ("on_policy", "lockstep"):
        return LockstepPopulation(algos, storages)
    raise ConfigError(f"{type(algos[0]).__name__} cannot train in a population yet: {can_batch()} can")
