"""What the off-policy populations share: which members they take, and an update phase for every member at once:
how many gradient steps each member takes (its single run's count), the population's steps in lockstep (a member
with fewer steps drops out of the later ones), and each member's metrics as the means of its steps', as
`algos.offpolicy.run_gradient_steps` gives a single run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from rlcli.algos.offpolicy import gradient_steps_now, mean_of_steps
from rlcli.buffers.her import HerReplayBuffer
from rlcli.buffers.replay import ReplayBuffer
from rlcli.contracts import RunClock
from rlcli.registry import ConfigError

REPLAY_STORAGES = (ReplayBuffer, HerReplayBuffer)
# (the members stepping, k of the phase's steps, every member's step count) -> each stepping member's metrics
GradientStep = Callable[[list[int], int, list[int]], dict[int, dict[str, torch.Tensor]]]


def update_phases(algos: Sequence[Any], storages: Sequence[Any], active: Sequence[bool],
                  clocks: Sequence[RunClock | None], gradient_step: GradientStep,
                  ) -> list[dict[str, torch.Tensor] | None]:
    """Each active member's phase metrics (None for the others; {} for a member whose storage holds nothing
    whole yet, which takes no step, as its single run)."""
    steps = [gradient_steps_now(a.gradient_steps, clock) if on and clock is not None and len(s) > 0 else 0
             for a, s, on, clock in zip(algos, storages, active, clocks, strict=True)]
    logs: list[dict[str, list[torch.Tensor]]] = [{} for _ in algos]
    for k in range(max(steps, default=0)):
        stepping = [m for m, n in enumerate(steps) if k < n]
        for m, metrics in gradient_step(stepping, k, steps).items():
            for name, value in metrics.items():
                logs[m].setdefault(name, []).append(value)
    return [None if not on or clock is None else {k: mean_of_steps(v) for k, v in log.items()}
            for on, clock, log in zip(active, clocks, logs, strict=True)]


def check_replay_members(algos: Sequence[Any], storages: Sequence[Any], batchable: str) -> None:
    """One line naming what keeps these members out of a population (the launcher then runs them one by one):
    the algorithm's own `population_refusal`, or a storage not of REPLAY_STORAGES. Uniform, n-step, prioritized,
    ERE and HER replay all draw their batches (HER: its relabelled goals too) from torch's CPU generator, which
    the population swaps to each member's stream; recurrent networks' sequences cannot batch. `batchable`: what
    can batch."""
    for algo, storage in zip(algos, storages, strict=True):
        refusal = algo.population_refusal() if hasattr(algo, "population_refusal") else None
        if refusal is not None:
            raise ConfigError(f"{refusal} cannot train in a population yet; {batchable} without it can")
        if not isinstance(storage, REPLAY_STORAGES):
            raise ConfigError(f"{type(storage).__name__} storage cannot train in a population yet; {batchable} can")
