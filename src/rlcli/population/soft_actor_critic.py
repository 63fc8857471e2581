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
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from rlcli.algos.entropy import EntropyCoefficient
from rlcli.batches import ReplayBatch
from rlcli.buffers.replay import ReplayBuffer
from rlcli.contracts import ActOutput, RunClock
from rlcli.population.phases import update_phases
from rlcli.population.stacking import (
    clip_limits,
    drawn_with,
    polyak_members,
    stack_members,
    stack_weights,
    step_members,
    vmapped,
)
from rlcli.registry import ConfigError

BATCHED_SOFT_ACTOR_CRITICS = "sac and tqc (MLP or CNN networks without gSDE, buffer=replay or buffer=nstep)"


@runtime_checkable
class BatchableSoftActorCritic(Protocol):
    """An entropy-regularized actor-critic whose gradient steps a population can take for many members at once."""

    networks: nn.Module
    policy_optimizer: Any
    critic_optimizer: Any
    temperature: EntropyCoefficient
    action_dim: int
    max_grad_norm: float | None
    batch_size: int
    gradient_steps: int  # resolved: -1 is one per transition the collect phase stored
    gradient_updates: int
    tau: float
    target_update_interval: int

    def alpha(self) -> torch.Tensor: ...

    def policy_outputs(self, obs: torch.Tensor) -> torch.Tensor: ...

    def act_on(self, params: torch.Tensor, values: torch.Tensor | None = None, deterministic: bool = False,
               carry: torch.Tensor | None = None) -> ActOutput: ...

    def soft_td_loss(self, batch: Any, alpha: torch.Tensor,
                     noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]: ...

    def actor_loss(self, obs: torch.Tensor, alpha: torch.Tensor,
                   noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]: ...

    def population_refusal(self) -> str | None: ...


def check_batchable(algos: Sequence[Any], storages: Sequence[Any]) -> None:
    """One line naming what keeps these members out of a population (the launcher then runs them one by one)."""
    for algo, storage in zip(algos, storages, strict=True):
        refusal = algo.population_refusal()
        if refusal is not None:
            raise ConfigError(f"{refusal} cannot train in a population yet; {BATCHED_SOFT_ACTOR_CRITICS} without it "
                              "can")
        if type(storage) is not ReplayBuffer:  # prioritized / ERE sample from numpy's stream, HER relabels
            raise ConfigError(f"{type(storage).__name__} storage cannot train in a population yet; "
                              f"{BATCHED_SOFT_ACTOR_CRITICS} can")


class _MemberPart(nn.Module):
    """One of the algorithm's losses (or its policy network) as a module call, for functional_call."""

    def __init__(self, algo: BatchableSoftActorCritic, part: str) -> None:
        super().__init__()
        self.networks = algo.networks
        self._algo, self._part = (algo,), part  # a tuple, not a submodule: its networks are registered once

    def forward(self, *args: Any) -> Any:
        algo = self._algo[0]
        if self._part == "critics":
            batch, alpha, noise = args
            return algo.soft_td_loss(ReplayBatch(*batch), alpha, noise)
        if self._part == "policy":
            obs, alpha, noise = args
            return algo.actor_loss(obs, alpha, noise)
        return algo.policy_outputs(args[0])  # acting's network part


class SoftActorCriticPopulationUpdate:
    """The members' acting and gradient steps as one: `policy_and_values` gives all members' policy outputs for
    their observations in one call; `update(active, storages, torch_rngs, clocks)` takes each member's update
    phase."""

    def __init__(self, algos: Sequence[Any], storages: Sequence[Any]) -> None:
        check_batchable(algos, storages)
        self.algos: list[BatchableSoftActorCritic] = list(algos)
        self.params, self.buffers = stack_weights([a.networks for a in algos])
        for stacked in self.params.values():
            stacked.requires_grad_(True)
        rows = {name: [a.networks.get_parameter(name) for a in algos] for name in self.params}
        self._critic_rows = {k: v for k, v in rows.items() if k.startswith("critics.")}
        self._policy_rows = {k: v for k, v in rows.items() if k.startswith("policy.")}
        self._alpha_rows = {"log_alpha": rows["log_alpha"]}
        first = self.algos[0]
        self._critic_losses = vmapped(_MemberPart(first, "critics"))
        self._actor_losses = vmapped(_MemberPart(first, "policy"))
        self._act = vmapped(_MemberPart(first, "act"))
        self._targets = [(self.params[k], self.params["critics." + k.removeprefix("critics_target.")])
                         for k in self.params if k.startswith("critics_target.")]
        self.device = self.params["log_alpha"].device

    @torch.inference_mode()
    def policy_and_values(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[members, envs, ...] observations -> each member's policy outputs (and an empty value slot), one call."""
        out = self._act(self.params, self.buffers, obs)
        return out, out.new_zeros(out.shape[:2])

    def update(self, active: Sequence[bool], storages: Sequence[Any], torch_rngs: list[torch.Tensor],
               clocks: Sequence[RunClock | None]) -> list[dict[str, torch.Tensor] | None]:
        """Each active member's update phase (None for the others): as many gradient steps as its single run takes,
        each on a batch from its own storage; its metrics are their means."""
        limit = clip_limits([a.max_grad_norm for a in self.algos], self.device)
        return update_phases(self.algos, storages, active, clocks,
                             lambda stepping, k, steps: self._gradient_step(stepping, k, steps, storages, torch_rngs,
                                                                            limit))

    def _gradient_step(self, stepping: list[int], k: int, steps: list[int], storages: Sequence[Any],
                       torch_rngs: list[torch.Tensor], limit: torch.Tensor | None) -> dict[int, dict[str, Any]]:
        algos, params, device = self.algos, self.params, self.device
        def draw(m: int) -> tuple[Any, torch.Tensor, torch.Tensor]:
            """In its single run's order: the batch, the next actions' noise, the policy's noise."""
            shape = (algos[m].batch_size, algos[m].action_dim)
            batch = storages[m].sample(algos[m].batch_size, k, steps[m])
            return batch, torch.randn(shape, device=device), torch.randn(shape, device=device)

        draws = {m: drawn_with(torch_rngs, m, partial(draw, m)) for m in stepping}
        batch = stack_members({m: tuple(d[0]) for m, d in draws.items()}, len(algos))
        next_noise, noise = (stack_members({m: d[i] for m, d in draws.items()}, len(algos)) for i in (1, 2))
        alpha = torch.stack([a.alpha() for a in algos])

        critic_losses, errors = self._critic_losses(params, self.buffers, batch, alpha, next_noise)
        step_members(params, critic_losses, self._critic_rows, stepping, limit,
                     [algos[m].critic_optimizer for m in stepping])
        # the policy climbs the critics just stepped, through their (detached) weights: dQ/da, no critic gradients
        frozen = {k: v.detach() if k.startswith("critics.") else v for k, v in params.items()}
        policy_losses, log_probs = self._actor_losses(frozen, self.buffers, batch[0], alpha, noise)
        step_members(params, policy_losses, self._policy_rows, stepping, limit,
                     [algos[m].policy_optimizer for m in stepping])
        learned = [m for m in stepping if algos[m].temperature.learned]
        if learned:
            targets = torch.tensor([a.temperature.target_entropy for a in algos], device=device)
            alpha_losses = -(params["log_alpha"].unsqueeze(-1) * (log_probs + targets.unsqueeze(-1))).mean(-1)
            step_members(params, alpha_losses, self._alpha_rows, learned, limit,
                         [algos[m].temperature.optimizer for m in learned])
        taus = [0.0] * len(algos)
        for m in stepping:  # each member's Polyak update at its own interval and tau
            algos[m].gradient_updates += 1
            if algos[m].gradient_updates % algos[m].target_update_interval == 0:
                taus[m] = algos[m].tau
        polyak_members(self._targets, taus)
        out = {}
        for m in stepping:
            storages[m].update_priorities(draws[m][0].indices, errors[m])
            out[m] = {"value_loss": critic_losses[m].detach(), "policy_loss": policy_losses[m].detach(),
                      "alpha": alpha[m], "entropy": -log_probs[m].mean()}
        return out
