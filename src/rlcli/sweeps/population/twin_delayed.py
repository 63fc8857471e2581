"""TD3 and DDPG members' gradient steps for a whole population, one vectorized call per loss.

A single run's step is the critics' step toward the smoothed target action; every `policy_delay`-th step also the
policy's step (through the critics just stepped) and the Polyak updates of both target networks (algos/td3.py).
The population keeps that order and calls the algorithm's own `critic_loss` and `actor_loss` (through
`functional_call` with the stacked weights, vectorized over members by `vmap`). Each member samples its own replay
and draws its smoothing noise from its own torch RNG stream, in its single run's order, keeps its own optimizers,
clip and tau, and counts its own steps toward its policy delay. Acting adds each member's own exploration noise
(Gaussian or Ornstein-Uhlenbeck, with its own decay) to its rows of the batched policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from rlcli.algos.td3 import explored
from rlcli.contracts import ActOutput
from rlcli.sweeps.population.actor_critic import ActorCriticPopulation
from rlcli.sweeps.population.catalog import can_batch
from rlcli.sweeps.population.phases import check_replay_members
from rlcli.sweeps.population.stacking import polyak_members, stack_members, step_members
from rlcli.sweeps.population.streams import Stream, drawn_with


def batched_twin_delayed() -> str:
    return f"{can_batch('twin_delayed')} (MLP or CNN networks, buffer=replay, nstep, per, ere or her)"


@runtime_checkable
class BatchableTwinDelayed(Protocol):
    """A deterministic-policy actor-critic whose gradient steps a population can take for many members at once."""

    networks: nn.Module
    policy_optimizer: Any
    critic_optimizer: Any
    action_dim: int
    max_grad_norm: float | None
    batch_size: int
    gradient_steps: int  # resolved: -1 is one per transition the collect phase stored
    gradient_updates: int
    tau: float
    policy_delay: int
    target_policy_noise: float
    noise: Any  # the exploration noise (ExplorationNoise: Gaussian, Ornstein-Uhlenbeck or none)
    noise_scale: float

    def policy_outputs(self, obs: torch.Tensor) -> torch.Tensor: ...

    def act_on(self, actions: torch.Tensor, values: torch.Tensor | None = None, deterministic: bool = False,
               carry: torch.Tensor | None = None) -> ActOutput: ...

    def critic_loss(self, batch: Any, noise: torch.Tensor | None = None,
                    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]: ...

    def actor_loss(self, obs: torch.Tensor) -> torch.Tensor: ...

    def population_refusal(self) -> str | None: ...


class TwinDelayedPopulationUpdate(ActorCriticPopulation):
    """TD3 and DDPG members as one population: ActorCriticPopulation's acting and update phases around this kind's
    gradient step."""

    def __init__(self, algos: Sequence[Any], storages: Sequence[Any]) -> None:
        check_replay_members(algos, storages, batched_twin_delayed())
        super().__init__(algos, critic_loss="critic_loss", actor_loss="actor_loss")
        self.algos: list[BatchableTwinDelayed] = list(algos)
        self._compiled = self.compiled_steps(self._critics_step_loss, self._policy_step_loss)

    def acting_noise(self, member: int, outputs: torch.Tensor) -> torch.Tensor:
        """The member's exploration noise for its rows of the batched policy actions, drawn as its `act_on` draws
        it (from the global generator, which the caller swaps to the member's stream; an Ornstein-Uhlenbeck
        state steps once)."""
        algo = self.algos[member]
        noise: torch.Tensor = algo.noise.sample(outputs.shape, algo.noise_scale)
        return noise

    @torch.inference_mode()
    def act_members(self, outputs: torch.Tensor, noise: dict[int, torch.Tensor],
                    values: torch.Tensor | None = None) -> dict[int, ActOutput]:
        """The noisy actions of the members in `noise`, in one call over their rows of `outputs` (elementwise:
        each member's actions are its `act_on`'s, bit for bit)."""
        members = list(noise)
        actions = outputs if len(members) == outputs.shape[0] else outputs[members]
        actions = explored(actions, torch.stack([noise[m] for m in members]))
        zeros = torch.zeros(actions.shape[:2], device=actions.device)
        return {m: ActOutput(actions[k], zeros[k], zeros[k], None) for k, m in enumerate(members)}

    def _critics_step_loss(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                           batch: tuple[torch.Tensor, ...], terms: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Any]:
        losses, (errors, q_means) = self.critic_losses(params, buffers, batch, terms["noise"])
        return losses, (losses.detach(), (errors, q_means))

    def _policy_step_loss(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                          obs: torch.Tensor, terms: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Any]:
        """(The critics are not what this step's optimizers train: the compiled step reads them as they are.)"""
        losses = self.actor_losses(params, buffers, obs)
        return losses, losses.detach()

    def gradient_step(self, stepping: list[int], k: int, steps: list[int], storages: Sequence[Any],
                      torch_rngs: list[Stream], limit: torch.Tensor | None) -> dict[int, dict[str, Any]]:
        algos, params, device = self.algos, self.params, self.device

        def draw(m: int) -> tuple[Any, torch.Tensor]:  # in its single run's order: the batch, then the smoothing
            batch = storages[m].sample(algos[m].batch_size, k, steps[m])
            shape = (algos[m].batch_size, algos[m].action_dim)
            smoothing = torch.randn(shape, device=device) if algos[m].target_policy_noise > 0 else \
                torch.zeros(shape, device=device)
            return batch, smoothing

        draws = {m: drawn_with(torch_rngs, m, partial(draw, m)) for m in stepping}
        batch = stack_members({m: tuple(d[0]) for m, d in draws.items()}, len(algos))
        noise = stack_members({m: d[1] for m, d in draws.items()}, len(algos))
        if self._compiled is not None:  # the same steps, each of all members one compiled graph
            critic_losses, (errors, q_means) = self._compiled[0].step(batch, {"noise": noise},
                                                                      self.members_mask(stepping))
        else:
            critic_losses, (errors, q_means) = self.critic_losses(params, self.buffers, batch, noise)
            step_members(params, critic_losses, self.critic_rows, stepping, limit,
                         [algos[m].critic_optimizer for m in stepping])
        out: dict[int, dict[str, Any]] = {}
        for m in stepping:
            algos[m].gradient_updates += 1
            storages[m].update_priorities(draws[m][0].indices, errors[m])
            out[m] = {"value_loss": critic_losses[m].detach(), "q_mean": q_means[m]}
        delayed = [m for m in stepping if algos[m].gradient_updates % algos[m].policy_delay == 0]
        if delayed:  # the policy climbs the critics just stepped
            if self._compiled is not None:
                policy_losses = self._compiled[1].step(batch[0], {}, self.members_mask(delayed))
            else:
                policy_losses = self.actor_losses(self.critics_frozen(), self.buffers, batch[0])
                step_members(params, policy_losses, self.policy_rows, delayed, limit,
                             [algos[m].policy_optimizer for m in delayed])
            polyak_members(self.targets, [algos[m].tau if m in delayed else 0.0 for m in range(len(algos))])
            for m in delayed:
                out[m]["policy_loss"] = policy_losses[m].detach()
        return out
