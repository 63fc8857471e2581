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

from rlcli.algos.grouped import GroupedOnPolicy
from rlcli.contracts import RunClock
from rlcli.registry import ConfigError
from rlcli.sweeps.population.lockstep import population_update
from rlcli.sweeps.population.streams import Stream


class GroupedPopulation:
    """The members' groups, each a lockstep population of its own (the population loop's `update` and `acting`)."""

    def __init__(self, algos: Sequence[GroupedOnPolicy], storages: Sequence[Any]) -> None:
        names = list(algos[0].algos)
        for algo in algos[1:]:
            if list(algo.algos) != names:
                raise ConfigError(f"the members' groups differ ({names} against {list(algo.algos)})")
        self.algos = list(algos)
        self.groups = {name: population_update([a.algos[name] for a in algos], storages) for name in names}
        self.acting = None  # each member's own act, as its single run

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
