"""What the soft actor-critic population (SAC / TQC in soft_actor_critic.py) builds on:
the members' stacked networks split into the parts each optimizer trains, their target networks paired with their
sources, acting's network part for all members in one call, and the update phase around the kind's own gradient
step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from rlcli.algos.loss_step import compile_enabled
from rlcli.contracts import RunClock
from rlcli.sweeps.population.compiled import CompiledMembersStep
from rlcli.sweeps.population.phases import update_phases
from rlcli.sweeps.population.stacking import MemberCall, clip_limits, members_mask, stack_weights, vmapped
from rlcli.sweeps.population.streams import Stream


class ActorCriticPopulation:
    """The members' stacked weights with `critic_rows`, `policy_rows` and the (target, source) pairs of every
    `*_target.` weight; `policy_and_values` runs the algorithm's `policy_outputs` for all members, `update` each
    member's phase of `gradient_step(stepping, k, steps, storages, torch_rngs, clip_limit)`."""

    def __init__(self, algos: Sequence[Any], critic_loss: str, actor_loss: str) -> None:
        self.params, self.buffers = stack_weights([a.networks for a in algos])
        for stacked in self.params.values():
            stacked.requires_grad_(True)
        rows = {name: [a.networks.get_parameter(name) for a in algos] for name in self.params}
        self.rows = rows
        self.critic_rows = {k: v for k, v in rows.items() if k.startswith("critics.")}
        self.policy_rows = {k: v for k, v in rows.items() if k.startswith("policy.")}
        self.targets = [(self.params[k], self.params[k.replace("_target.", ".", 1)])
                        for k in self.params if "_target." in k]
        self.device = next(iter(self.params.values())).device
        first = algos[0]
        self.critic_losses = vmapped(MemberCall(first, critic_loss, takes_batch=True))
        self.actor_losses = vmapped(MemberCall(first, actor_loss))
        self._act = vmapped(MemberCall(first, "policy_outputs"))
        self._algos = list(algos)

    @torch.inference_mode()
    def policy_and_values(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[members, envs, ...] observations -> each member's policy outputs (and an empty value slot), one call."""
        out: torch.Tensor = self._act(self.params, self.buffers, obs)
        return out, out.new_zeros(out.shape[:2])

    def compiled_steps(self, critics_loss: Callable[..., Any], policy_loss: Callable[..., Any],
                       ) -> tuple[CompiledMembersStep, CompiledMembersStep] | None:
        """compile=true members (all or none: compile is part of the population key): the critics' step and the
        policy's step of all members, one compiled graph each (compiled.py), over `*_loss(params, buffers, batch,
        terms) -> (losses, stats)`; None for eager members."""
        if not all(compile_enabled(a) for a in self._algos):
            return None
        limit = clip_limits([a.max_grad_norm for a in self._algos], self.device)
        return (CompiledMembersStep(critics_loss, self.params, self.buffers, self.critic_rows,
                                    [a.critic_optimizer for a in self._algos], limit),
                CompiledMembersStep(policy_loss, self.params, self.buffers, self.policy_rows,
                                    [a.policy_optimizer for a in self._algos], limit))

    def members_mask(self, stepping: Sequence[int]) -> torch.Tensor:
        return members_mask(stepping, len(self._algos), self.device)

    def critics_frozen(self) -> dict[str, torch.Tensor]:
        """The weights with the critics' detached: the policy's loss through them gives dQ/da, no critic gradients
        (what `algos.base.frozen` does in a single run)."""
        return {k: v.detach() if k.startswith("critics.") else v for k, v in self.params.items()}

    def update(self, active: Sequence[bool], storages: Sequence[Any], torch_rngs: list[Stream],
               clocks: Sequence[RunClock | None]) -> list[dict[str, torch.Tensor] | None]:
        """Each active member's update phase (None for the others): as many gradient steps as its single run takes,
        each on a batch from its own storage; its metrics are their means."""
        limit = clip_limits([a.max_grad_norm for a in self._algos], self.device)
        return update_phases(self._algos, storages, active, clocks, lambda stepping, k, steps: self.gradient_step(
            stepping, k, steps, storages, torch_rngs, limit))

    def gradient_step(self, stepping: list[int], k: int, steps: list[int], storages: Sequence[Any],
                      torch_rngs: list[Stream], limit: torch.Tensor | None) -> dict[int, dict[str, Any]]:
        """The stepping members' k-th gradient step of the phase (each member's draws from its own stream): the
        kind's own, in soft_actor_critic.py."""
        raise NotImplementedError
