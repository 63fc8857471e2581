"""A population of algo.groups runs (algos/grouped.py): one lockstep population per group of agents, over the
members' copies of that group's algorithm, each stepping on the members' own columns of their rollouts.

A grouped single run updates its groups one after another, each on its columns (`GroupedOnPolicy.update`); so does
this, each group's update batched over the members, every member drawing from its own stream in that order. The
members act with their own `act` (every group's policy on every row, each row its own group's), as their single runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rlcli.algos.grouped import GroupedOnPolicy, shares_rollout
from rlcli.contracts import RunClock
from rlcli.registry import ALGOS, ConfigError
from rlcli.sweeps.population.acting import MembersActing
from rlcli.sweeps.population.catalog import batchable_names, declared_kind
from rlcli.sweeps.population.lockstep import LockstepPopulation, population_update
from rlcli.sweeps.population.streams import Stream


class GroupedPopulation:
    """The members' groups, each a lockstep population of its own (the population loop's `update` and `acting`)."""

    def __init__(self, algos: Sequence[GroupedOnPolicy], storages: Sequence[Any]) -> None:
        names = list(algos[0].algos)
        for algo in algos[1:]:
            if list(algo.algos) != names:
                raise ConfigError(f"the members' groups differ ({names} against {list(algo.algos)})")
        self.algos = list(algos)
        self.groups = {name: _group_population(name, [a.algos[name] for a in algos], storages) for name in names}
        self.acting: MembersActing | None = None  # each member's own act, as its single run

    def update(self, active: Sequence[bool], storages: Sequence[Any], torch_rngs: list[Stream],
               clocks: Sequence[RunClock | None] = ()) -> list[dict[str, torch.Tensor] | None]:
        """Each group's update over the active members' columns, in the groups' order; the metrics as
        <group>/<metric>, as a grouped single run logs them."""
        parts = [algo._parts if on else None for algo, on in zip(self.algos, active, strict=True)]
        if any(on and part is None for on, part in zip(active, parts, strict=True)):
            raise RuntimeError("update() before finish_rollout(): the groups' rollouts are made there")
        results: list[dict[str, torch.Tensor] | None] = [{} if on else None for on in active]
        for k, (name, population) in enumerate(self.groups.items()):
            columns = [part[k] if part is not None else storage for part, storage in zip(parts, storages, strict=True)]
            for result, metrics in zip(results, population.update(active, columns, torch_rngs, clocks), strict=True):
                if result is not None and metrics is not None:
                    result |= {f"{name}/{key}": value for key, value in metrics.items()}
        for algo, on in zip(self.algos, active, strict=True):
            if on:
                algo._parts = None
        return results


def _group_population(group: str, algos: list[Any], storages: Sequence[Any]) -> LockstepPopulation:
    """One group's lockstep population, or one line naming the group (and, for an algorithm that cannot batch, the
    ones a group can run that do)."""
    try:
        return population_update(algos, storages)
    except ConfigError as error:
        if declared_kind(algos[0]) is None:
            name = next(n for n in ALGOS.names() if ALGOS.get(n) is type(algos[0]))
            can = [n for n in batchable_names("on_policy") if shares_rollout(ALGOS.spec(n), ALGOS.spec(name))]
            raise ConfigError(f"algo.groups.{group}.name={name} cannot train in a population yet; a group on "
                              f"{', '.join(can[:-1])} and {can[-1]} can") from None
        raise ConfigError(f"algo.groups.{group}: {error}") from None
