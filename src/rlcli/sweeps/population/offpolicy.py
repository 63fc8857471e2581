"""The off-policy workhorses' updates for a whole population: DQN and QR-DQN members' gradient steps in one
vectorized call each.

The loss is the algorithm's own `transition_loss` (one member's code, called through `functional_call` with the
stacked weights and vectorized over members by `vmap`), so a population computes what single runs compute. Each
member samples its own replay with its own torch RNG stream (the draws its single run makes), keeps its own
gradient-norm clip, learning rate, optimizer state and target network (updated at its own interval by the
algorithm's `finish_update`), and takes as many gradient steps as its single run would; members that are still
warming up (algo.learning_starts), have stopped, or take fewer steps this phase are carried along but not stepped.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from rlcli.algos.exploration import epsilon_choice, epsilon_draws
from rlcli.algos.loss_step import compile_enabled
from rlcli.contracts import ActOutput, RunClock
from rlcli.registry import ConfigError
from rlcli.sweeps.population.catalog import can_batch
from rlcli.sweeps.population.compiled import CompiledMembersStep
from rlcli.sweeps.population.phases import check_replay_members, update_phases
from rlcli.sweeps.population.stacking import (
    MemberCall,
    clip_limits,
    members_mask,
    stack_members,
    stack_weights,
    step_members,
    vmapped,
)
from rlcli.sweeps.population.streams import Stream, drawn_with


@runtime_checkable
class BatchableGradientSteps(Protocol):
    """A value-based off-policy algorithm whose gradient steps a population can take for many members at once."""

    networks: nn.Module
    optimizer: Any
    max_grad_norm: float | None
    epsilon: float  # epsilon-greedy's, as the schedule set it for this collect phase
    n_actions: int
    batch_size: int
    gradient_steps: int  # resolved: -1 is one per transition the collect phase stored
    gradient_updates: int

    def q_values(self, obs: torch.Tensor, target: bool = False) -> torch.Tensor: ...

    def act_on(self, q: torch.Tensor, values: torch.Tensor | None = None, deterministic: bool = False,
               carry: torch.Tensor | None = None) -> ActOutput: ...

    def transition_loss(self, batch: Any) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]: ...

    def finish_update(self, clock: RunClock, metrics: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]: ...

    def population_refusal(self) -> str | None: ...


def check_batchable(algos: Sequence[Any], storages: Sequence[Any]) -> None:
    """One line naming what keeps these members out of a population (the launcher then runs them one by one)."""
    if not isinstance(algos[0], BatchableGradientSteps):
        raise ConfigError(f"{type(algos[0]).__name__} cannot train in a population of value-based members: "
                          f"{batched_off_policy()} can")
    check_replay_members(algos, storages, batched_off_policy())


def batched_off_policy() -> str:
    return f"{can_batch('value_based')} (MLP or CNN Q-networks, buffer=replay, nstep, per, ere or her)"


class OffPolicyPopulationUpdate:
    """The members' acting and gradient steps as one: `policy_and_values` gives all members' Q-values for their
    observations in one call; `update(active, storages, torch_rngs, clocks)` takes each member's update phase."""

    def __init__(self, algos: Sequence[Any], storages: Sequence[Any]) -> None:
        check_batchable(algos, storages)
        self.algos: list[BatchableGradientSteps] = list(algos)
        self.params, self.buffers = stack_weights([a.networks for a in algos])
        for stacked in self.params.values():
            stacked.requires_grad_(True)
        self._rows = {name: [a.networks.get_parameter(name) for a in algos] for name in self.params}
        first = self.algos[0]
        self._losses = vmapped(MemberCall(first, "transition_loss", takes_batch=True))
        self._q = vmapped(MemberCall(first, "q_values"))
        self._compiled: CompiledMembersStep | None = None
        if all(compile_enabled(a) for a in self.algos):  # compile=true is part of the population key: all or none
            self._compiled = CompiledMembersStep(self._member_losses, self.params, self.buffers, self._rows,
                                                 [a.optimizer for a in self.algos],
                                                 clip_limits([a.max_grad_norm for a in algos],
                                                             next(iter(self.params.values())).device))

    def _member_losses(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                       batch: tuple[torch.Tensor, ...], terms: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Any]:
        """The vectorized transition loss in the compiled step's form: the losses, and what to log beside them."""
        losses, (errors, q_means) = self._losses(params, buffers, batch)
        return losses, (losses.detach(), errors, q_means)

    @torch.inference_mode()
    def policy_and_values(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[members, envs, ...] observations -> each member's Q-values (and an empty value slot), one call."""
        q = self._q(self.params, self.buffers, obs)
        return q, q.new_zeros(q.shape[:2])

    def acting_noise(self, member: int, outputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The member's epsilon-greedy draws for its rows of the batched Q-values, from the global CPU generator
        (the caller swaps the member's stream in): which envs explore, then their random actions, as
        `epsilon_greedy` draws them in its single run."""
        algo = self.algos[member]
        return epsilon_draws(outputs.shape[:-1], algo.n_actions, algo.epsilon)

    @torch.inference_mode()
    def act_members(self, outputs: torch.Tensor, draws: dict[int, tuple[torch.Tensor, torch.Tensor]],
                    values: torch.Tensor | None = None) -> dict[int, ActOutput]:
        """The epsilon-greedy actions of the members in `draws`, in one call over their rows of `outputs` (the
        greedy argmax and the choice are per element: each member's actions are its `act_on`'s, bit for bit)."""
        members = list(draws)
        q = outputs if len(members) == outputs.shape[0] else outputs[members]
        actions = epsilon_choice(q.argmax(-1), *(torch.stack([draws[m][i] for m in members]) for i in (0, 1)))
        zeros = torch.zeros(actions.shape, device=actions.device)
        return {m: ActOutput(actions[k], zeros[k], zeros[k], None) for k, m in enumerate(members)}

    def update(self, active: Sequence[bool], storages: Sequence[Any], torch_rngs: list[Stream],
               clocks: Sequence[RunClock | None]) -> list[dict[str, torch.Tensor] | None]:
        """Each active member's update phase (None for the others): its gradient steps on batches from its own
        storage, then its target network and metrics (`finish_update`)."""
        algos = self.algos
        losses_device = next(iter(self.params.values())).device
        limit = clip_limits([a.max_grad_norm for a in algos], losses_device)

        def gradient_step(stepping: list[int], k: int, steps: list[int]) -> dict[int, dict[str, torch.Tensor]]:
            batches = {m: drawn_with(torch_rngs, m, partial(storages[m].sample, algos[m].batch_size, k, steps[m]))
                       for m in stepping}
            batch = stack_members(batches, len(algos))
            if self._compiled is not None:
                losses, errors, q_means = self._compiled.step(batch, {}, members_mask(stepping, len(algos),
                                                                                      losses_device))
            else:
                losses, (errors, q_means) = self._losses(self.params, self.buffers, batch)
                step_members(self.params, losses, self._rows, stepping, limit, [algos[m].optimizer for m in stepping])
            for m in stepping:
                storages[m].update_priorities(batches[m].indices, errors[m])
                algos[m].gradient_updates += 1
            return {m: {"value_loss": losses[m].detach(), "q_mean": q_means[m]} for m in stepping}

        results = update_phases(algos, storages, active, clocks, gradient_step)
        for m, (algo, storage, clock, metrics) in enumerate(zip(algos, storages, clocks, results, strict=True)):
            if metrics is not None and clock is not None and len(storage) > 0:  # as a single run: no target update
                results[m] = algo.finish_update(clock, metrics)  # while nothing whole is stored yet
        return results
