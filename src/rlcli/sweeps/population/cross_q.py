"""CrossQ members' gradient steps for a whole population, one vectorized call per loss.

A single run's step is the critics' step on the joint batch [(s, a); (s', a')] with the critics in training mode
(their Batch Renormalization statistics updated); every `policy_delay`-th step also the policy's step (the policy in
training mode, through the critics just stepped, read with their running statistics) and the temperature's
(algos/crossq.py). No target networks. The population keeps that order and calls the algorithm's own `critic_loss`
and `policy_loss` (through `functional_call` with the stacked weights and the stacked renormalization statistics,
vectorized over members by `vmap`, which updates each member's statistics in its own rows). Each member samples its
own replay and draws its next actions' and policy's noise from its own torch RNG stream, in its single run's order,
and counts its own steps toward its policy delay. Acting and the temperature's step are SAC's
(soft_actor_critic.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any, Protocol, cast, runtime_checkable

import torch

from rlcli.algos.crossq import training_mode
from rlcli.sweeps.population.catalog import can_batch
from rlcli.sweeps.population.soft_actor_critic import SoftActorCriticMembers, SoftActorCriticPopulationUpdate
from rlcli.sweeps.population.stacking import stack_members, step_members
from rlcli.sweeps.population.streams import Stream, drawn_with


def batched_cross_q() -> str:
    return f"{can_batch('cross_q')} (MLP networks, buffer=replay, nstep, per, ere or her)"


@runtime_checkable
class BatchableCrossQ(SoftActorCriticMembers, Protocol):
    """CrossQ as a population steps it: SAC's acting and temperature, CrossQ's joint critic loss and policy delay."""

    policy_delay: int

    def critic_loss(self, batch: Any, alpha: torch.Tensor,
                    noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]: ...

    def policy_loss(self, obs: torch.Tensor, alpha: torch.Tensor,
                    noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]: ...


class CrossQPopulationUpdate(SoftActorCriticPopulationUpdate):
    """CrossQ members as one population: SAC's acting, alphas and temperature step around CrossQ's gradient step."""

    critic_loss_name, actor_loss_name = "critic_loss", "policy_loss"

    @staticmethod
    def batchable() -> str:
        return batched_cross_q()

    def gradient_step(self, stepping: list[int], k: int, steps: list[int], storages: Sequence[Any],
                      torch_rngs: list[Stream], limit: torch.Tensor | None) -> dict[int, dict[str, Any]]:
        algos, params = cast(list[BatchableCrossQ], self.algos), self.params
        networks: Any = algos[0].networks  # the module the vectorized calls run (each member's weights swapped in)
        delayed = [m for m in stepping if (algos[m].gradient_updates + 1) % algos[m].policy_delay == 0]

        def draw(m: int) -> tuple[Any, ...]:
            """In its single run's order: the batch, the next actions' noise, then (on a delayed step) the policy's."""
            shape = (algos[m].batch_size, algos[m].action_dim)
            batch = storages[m].sample(algos[m].batch_size, k, steps[m])
            drawn = [torch.randn(shape, device=self.device) for _ in range(2 if m in delayed else 1)]
            return batch, *drawn

        draws = {m: drawn_with(torch_rngs, m, partial(draw, m)) for m in stepping}
        batch = stack_members({m: tuple(d[0]) for m, d in draws.items()}, len(algos))
        alpha = self._alphas()
        with _statistics_kept(self.buffers, "critics.", stepping, len(algos)), training_mode(networks.critics):
            critic_losses, errors = self.critic_losses(params, self.buffers, batch, alpha,
                                                       stack_members({m: d[1] for m, d in draws.items()}, len(algos)))
        step_members(params, critic_losses, self.critic_rows, stepping, limit,
                     [algos[m].critic_optimizer for m in stepping])
        out: dict[int, dict[str, Any]] = {}
        for m in stepping:
            algos[m].gradient_updates += 1
            storages[m].update_priorities(draws[m][0].indices, errors[m])
            out[m] = {"value_loss": critic_losses[m].detach(), "alpha": alpha[m]}
        if delayed:  # the policy climbs the critics just stepped, read with their running statistics
            noise = stack_members({m: draws[m][2] for m in delayed}, len(algos))
            with _statistics_kept(self.buffers, "policy.", delayed, len(algos)), training_mode(networks.policy):
                policy_losses, log_probs = self.actor_losses(self.critics_frozen(), self.buffers, batch[0], alpha,
                                                             noise)
            step_members(params, policy_losses, self.policy_rows, delayed, limit,
                         [algos[m].policy_optimizer for m in delayed])
            self.temperature_step(delayed, log_probs, limit)
            entropy = -log_probs.detach().mean(-1)
            for m in delayed:
                out[m] |= {"policy_loss": policy_losses[m].detach(), "entropy": entropy[m]}
        return out


@contextlib.contextmanager
def _statistics_kept(buffers: dict[str, torch.Tensor], prefix: str, stepping: Sequence[int],
                     members: int) -> Iterator[None]:
    """The renormalization statistics under `prefix` of the members not stepping (whose rows the vectorized call
    computes on another member's batch) as they were before the call."""
    idle = [m for m in range(members) if m not in stepping]
    kept = {name: stacked[idle].clone() for name, stacked in buffers.items() if name.startswith(prefix)} if idle else {}
    try:
        yield
    finally:
        with torch.no_grad():
            for name, rows in kept.items():
                buffers[name][idle] = rows
