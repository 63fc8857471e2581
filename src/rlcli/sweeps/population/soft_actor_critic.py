"""SAC and TQC members' gradient steps for a whole population, in three vectorized calls per step.

A single run's step is the critics' step, then the policy's (through the critics just stepped), then the
temperature's, then the Polyak target update (algos/sac.py). The population keeps that order and calls the
algorithm's own `soft_td_loss` and `actor_loss` (through `functional_call` with the stacked weights, vectorized
over members by `vmap`), so it computes what single runs compute. Each member samples its own replay and draws its
policy noise from its own torch RNG stream (the draws its single run makes, in the same order), and keeps its own
optimizers, gradient-norm clip, entropy coefficient (fixed or learned toward its own target), tau and target
interval. Members that are warming up, have stopped or take fewer gradient steps are carried along, not stepped.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, Protocol, cast, runtime_checkable

import torch
from torch import nn

from rlcli.actors.offpolicy import squashed_gaussian
from rlcli.actors.sde import StateDependentNoise, StateDependentSquashedPolicy
from rlcli.algos.entropy import EntropyCoefficient
from rlcli.contracts import ActOutput
from rlcli.sweeps.population.actor_critic import ActorCriticPopulation
from rlcli.sweeps.population.catalog import can_batch
from rlcli.sweeps.population.phases import check_replay_members
from rlcli.sweeps.population.stacking import polyak_members, stack_members, step_members
from rlcli.sweeps.population.streams import Stream, drawn_with

SDE_MATRIX = "policy.noise.eps"  # gSDE's exploration matrices: the members' own while acting, stacked for training


def batched_soft_actor_critics() -> str:
    return f"{can_batch('soft_actor_critic')} (MLP or CNN networks, buffer=replay, nstep, per, ere or her)"


@runtime_checkable
class SoftActorCriticMembers(Protocol):
    """What the entropy-regularized actor-critics' populations (this one, cross_q.py's) read of every member: its
    optimizers and temperature, its squashed-Gaussian acting, its batch and step counts."""

    networks: nn.Module
    policy_optimizer: Any
    critic_optimizer: Any
    temperature: EntropyCoefficient
    action_dim: int
    max_grad_norm: float | None
    batch_size: int
    gradient_steps: int  # resolved: -1 is one per transition the collect phase stored
    gradient_updates: int

    def alpha(self) -> torch.Tensor: ...

    def policy_outputs(self, obs: torch.Tensor) -> torch.Tensor: ...

    def act_on(self, params: torch.Tensor, values: torch.Tensor | None = None, deterministic: bool = False,
               carry: torch.Tensor | None = None) -> ActOutput: ...

    def population_refusal(self) -> str | None: ...


@runtime_checkable
class BatchableSoftActorCritic(SoftActorCriticMembers, Protocol):
    """An entropy-regularized actor-critic with target critics (SAC, TQC) whose gradient steps a population can take
    for many members at once."""

    tau: float
    target_update_interval: int

    def soft_td_loss(self, batch: Any, alpha: torch.Tensor,
                     noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]: ...

    def actor_loss(self, obs: torch.Tensor, alpha: torch.Tensor,
                   noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]: ...


class SoftActorCriticPopulationUpdate(ActorCriticPopulation):
    """SAC and TQC members as one population: ActorCriticPopulation's acting and update phases around this kind's
    gradient step."""

    critic_loss_name, actor_loss_name = "soft_td_loss", "actor_loss"  # the algorithm's losses the steps vectorize

    def __init__(self, algos: Sequence[Any], storages: Sequence[Any]) -> None:
        check_replay_members(algos, storages, self.batchable())
        super().__init__(algos, critic_loss=self.critic_loss_name, actor_loss=self.actor_loss_name)
        self.algos: list[BatchableSoftActorCritic] = list(algos)
        self.alpha_rows = {"log_alpha": self.rows["log_alpha"]}
        self.sde_noises = [_sde_noise(a) for a in self.algos]
        self.sde = self.sde_noises[0] is not None
        if self.sde:  # each stepping member's training matrix, copied in at every gradient step (the losses read it)
            noise = self.sde_noises[0]
            assert noise is not None
            self.buffers[SDE_MATRIX] = torch.zeros(len(self.algos), 1, noise.latent_dim, noise.action_dim,
                                                   device=self.device)
        self._compiled = self.compiled_steps(self._critics_step_loss, self._policy_step_loss)
        self._target_entropies: torch.Tensor | None = None

    @staticmethod
    def batchable() -> str:
        return batched_soft_actor_critics()

    def acting_noise(self, member: int, outputs: torch.Tensor) -> torch.Tensor | None:
        """The member's acting draw for its rows of the batched policy outputs, taken from the global generator
        (the caller swaps the member's stream in): the standard normals its single run's `squashed_gaussian` draws
        (`randn_like` of the means). None with gSDE: its members act one by one (`act_on`), with their own
        exploration matrices."""
        if self.sde:
            return None
        means = outputs[..., : outputs.shape[-1] // 2]
        return torch.randn(means.shape, dtype=means.dtype, device=means.device)

    @torch.inference_mode()
    def act_members(self, outputs: torch.Tensor, noise: dict[int, torch.Tensor],
                    values: torch.Tensor | None = None) -> dict[int, ActOutput]:
        """The squashed Gaussian's actions of the members in `noise`, in one call over their rows of `outputs`
        (elementwise: each member's actions are its single run's, bit for bit)."""
        members = list(noise)
        rows = outputs if len(members) == outputs.shape[0] else outputs[members]
        actions, log_probs = squashed_gaussian(rows, False, torch.stack([noise[m] for m in members]))
        return {m: ActOutput(actions[k], log_probs[k], torch.zeros_like(log_probs[k]), None)
                for k, m in enumerate(members)}

    def _critics_step_loss(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                           batch: tuple[torch.Tensor, ...], terms: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Any]:
        losses, errors = self.critic_losses(params, buffers, batch, terms["alpha"], *_noise(terms))
        return losses, (losses.detach(), errors)

    def _policy_step_loss(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                          obs: torch.Tensor, terms: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Any]:
        """(The critics are not what this step's optimizers train: the compiled step reads them as they are.)"""
        losses, log_probs = self.actor_losses(params, buffers, obs, terms["alpha"], *_noise(terms))
        return losses, (losses.detach(), log_probs)

    def gradient_step(self, stepping: list[int], k: int, steps: list[int], storages: Sequence[Any],
                      torch_rngs: list[Stream], limit: torch.Tensor | None) -> dict[int, dict[str, Any]]:
        algos, params, device = self.algos, self.params, self.device
        def draw(m: int) -> tuple[Any, ...]:
            """In its single run's order: the batch, then the next actions' noise and the policy's noise (gSDE:
            one fresh exploration matrix, which is the noise of both)."""
            shape = (algos[m].batch_size, algos[m].action_dim)
            batch = storages[m].sample(algos[m].batch_size, k, steps[m])
            noise = self.sde_noises[m]
            if noise is not None:
                noise.reset_noise()
                return (batch,)
            return batch, torch.randn(shape, device=device), torch.randn(shape, device=device)

        draws = {m: drawn_with(torch_rngs, m, partial(draw, m)) for m in stepping}
        batch = stack_members({m: tuple(d[0]) for m, d in draws.items()}, len(algos))
        if self.sde:
            with torch.no_grad():
                for m in stepping:
                    self.buffers[SDE_MATRIX][m].copy_(cast(StateDependentNoise, self.sde_noises[m]).eps[0])
            next_noise = noise = {}
        else:
            next_noise, noise = ({"noise": stack_members({m: d[i] for m, d in draws.items()}, len(algos))}
                                 for i in (1, 2))
        alpha = self._alphas()

        if self._compiled is not None:  # the same two steps, each of all members one compiled graph
            active = self.members_mask(stepping)
            critic_losses, errors = self._compiled[0].step(batch, {"alpha": alpha, **next_noise}, active)
            policy_losses, log_probs = self._compiled[1].step(batch[0], {"alpha": alpha, **noise}, active)
        else:
            critic_losses, errors = self.critic_losses(params, self.buffers, batch, alpha, *next_noise.values())
            step_members(params, critic_losses, self.critic_rows, stepping, limit,
                         [algos[m].critic_optimizer for m in stepping])
            # the policy climbs the critics just stepped
            policy_losses, log_probs = self.actor_losses(self.critics_frozen(), self.buffers, batch[0], alpha,
                                                         *noise.values())
            step_members(params, policy_losses, self.policy_rows, stepping, limit,
                         [algos[m].policy_optimizer for m in stepping])
        self.temperature_step(stepping, log_probs, limit)
        taus = [0.0] * len(algos)
        for m in stepping:  # each member's Polyak update at its own interval and tau
            algos[m].gradient_updates += 1
            if algos[m].gradient_updates % algos[m].target_update_interval == 0:
                taus[m] = algos[m].tau
        polyak_members(self.targets, taus)
        out = {}
        entropy = -log_probs.detach().mean(-1)  # every member's in one reduction
        for m in stepping:
            storages[m].update_priorities(draws[m][0].indices, errors[m])
            out[m] = {"value_loss": critic_losses[m].detach(), "policy_loss": policy_losses[m].detach(),
                      "alpha": alpha[m], "entropy": entropy[m]}
        return out

    def temperature_step(self, stepping: list[int], log_probs: torch.Tensor, limit: torch.Tensor | None) -> None:
        """The entropy coefficient's step of each stepping member that learns it, toward its own target entropy
        (`EntropyCoefficient.step`'s loss, all members' in one backward)."""
        algos = self.algos
        learned = [m for m in stepping if algos[m].temperature.learned]
        if not learned:
            return
        if self._target_entropies is None:  # fixed for the run: built once, not sent to the device every step
            self._target_entropies = torch.tensor([a.temperature.target_entropy for a in algos], device=self.device)
        targets = self._target_entropies
        alpha_losses = -(self.params["log_alpha"].unsqueeze(-1) * (log_probs + targets.unsqueeze(-1))).mean(-1)
        step_members(self.params, alpha_losses, self.alpha_rows, learned, limit,
                     [algos[m].temperature.optimizer for m in learned])

    def _alphas(self) -> torch.Tensor:
        """Every member's entropy coefficient, [members]: one exp over the stacked log alphas where all are learned
        (elementwise: each member's `alpha()` bit for bit), else each member's own."""
        if all(a.temperature.learned for a in self.algos):
            return self.params["log_alpha"].detach().exp()
        return torch.stack([a.alpha() for a in self.algos])


def _noise(terms: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """The policy's drawn noise, when there is one (gSDE's noise is the exploration matrix, a buffer)."""
    return (terms["noise"],) if "noise" in terms else ()


def _sde_noise(algo: Any) -> StateDependentNoise | None:
    """A member's gSDE noise module (None without gSDE)."""
    policy = algo.networks.policy
    return policy.noise if isinstance(policy, StateDependentSquashedPolicy) else None
