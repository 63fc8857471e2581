"""What can batch, read from the algorithms' registered specs (`AlgoSpec.population`) rather than written by hand:
a new batchable algorithm declares its kind and every refusal names it."""

from __future__ import annotations

from rlcli.contracts import PopulationKind
from rlcli.registry import ALGOS


def batchable_names(kind: PopulationKind | None = None) -> list[str]:
    """The registered algorithms whose runs batch as `kind` (any kind: None), in the registry's order."""
    names = []
    for name in ALGOS.names():
        declared = ALGOS.spec(name).population
        if declared is not None and kind in (None, declared):
            names.append(name)
    return names


def can_batch(kind: PopulationKind | None = None) -> str:
    """`batchable_names` as a sentence's list: "a2c, pg and ppo"."""
    names = batchable_names(kind)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def declared_kind(algo: object) -> PopulationKind | None:
    """The population kind registered for this algorithm's class (None: not batchable, or not registered as a
    class)."""
    for name in ALGOS.names():
        if ALGOS.get(name) is type(algo):
            kind: PopulationKind | None = ALGOS.spec(name).population
            return kind
    return None
