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

BATCHED_TWIN_DELAYED = "td3 and ddpg (MLP or CNN networks, buffer=replay or buffer=nstep)"


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

    def policy_outputs(self, obs: torch.Tensor) -> torch.Tensor: ...

    def act_on(self, actions: torch.Tensor, values: torch.Tensor | None = None, deterministic: bool = False,
               carry: torch.Tensor | None = None) -> ActOutput: ...

    def critic_loss(self, batch: Any, noise: torch.Tensor | None = None,
                    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]: ...

    def actor_loss(self, obs: torch.Tensor) -> torch.Tensor: ...

    def population_refusal(self) -> str | None: ...


def check_batchable(algos: Sequence[Any], storages: Sequence[Any]) -> None:
    """One line naming what keeps these members out of a population (the launcher then runs them one by one)."""
    for algo, storage in zip(algos, storages, strict=True):
        refusal = algo.population_refusal()
        if refusal is not None:
            raise ConfigError(f"{refusal} cannot train in a population yet; {BATCHED_TWIN_DELAYED} without it can")
        if type(storage) is not ReplayBuffer:  # prioritized / ERE sample from numpy's stream, HER relabels
            raise ConfigError(f"{type(storage).__name__} storage cannot train in a population yet; "
                              f"{BATCHED_TWIN_DELAYED} can")


class _MemberPart(nn.Module):
    """One of the algorithm's losses (or acting's network part) as a module call, for functional_call."""

    def __init__(self, algo: BatchableTwinDelayed, part: str) -> None:
        super().__init__()
        self.networks = algo.networks
        self._algo, self._part = (algo,), part  # a tuple, not a submodule: its networks are registered once

    def forward(self, *args: Any) -> Any:
        algo = self._algo[0]
        if self._part == "critics":
            batch, noise = args
            return algo.critic_loss(ReplayBatch(*batch), noise)
        if self._part == "policy":
            return algo.actor_loss(args[0])
        return algo.policy_outputs(args[0])


class TwinDelayedPopulationUpdate:
    """The members' acting and gradient steps as one: `policy_and_values` gives all members' policy actions for
    their observations in one call; `update(active, storages, torch_rngs, clocks)` takes each member's update
    phase."""

    def __init__(self, algos: Sequence[Any], storages: Sequence[Any]) -> None:
        check_batchable(algos, storages)
        self.algos: list[BatchableTwinDelayed] = list(algos)
        self.params, self.buffers = stack_weights([a.networks for a in algos])
        for stacked in self.params.values():
            stacked.requires_grad_(True)
        rows = {name: [a.networks.get_parameter(name) for a in algos] for name in self.params}
        self._critic_rows = {k: v for k, v in rows.items() if k.startswith("critics.")}
        self._policy_rows = {k: v for k, v in rows.items() if k.startswith("policy.")}
        first = self.algos[0]
        self._critic_losses = vmapped(_MemberPart(first, "critics"))
        self._actor_losses = vmapped(_MemberPart(first, "policy"))
        self._act = vmapped(_MemberPart(first, "act"))
        self._targets = [(self.params[k], self.params[k.replace("_target.", ".", 1)])
                         for k in self.params if k.startswith(("critics_target.", "policy_target."))]
        self.device = next(iter(self.params.values())).device

    @torch.inference_mode()
    def policy_and_values(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[members, envs, ...] observations -> each member's policy actions (and an empty value slot), one call."""
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

        def draw(m: int) -> tuple[Any, torch.Tensor]:  # in its single run's order: the batch, then the smoothing
            batch = storages[m].sample(algos[m].batch_size, k, steps[m])
            shape = (algos[m].batch_size, algos[m].action_dim)
            smoothing = torch.randn(shape, device=device) if algos[m].target_policy_noise > 0 else \
                torch.zeros(shape, device=device)
            return batch, smoothing

        draws = {m: drawn_with(torch_rngs, m, partial(draw, m)) for m in stepping}
        batch = stack_members({m: tuple(d[0]) for m, d in draws.items()}, len(algos))
        noise = stack_members({m: d[1] for m, d in draws.items()}, len(algos))
        critic_losses, (errors, q_means) = self._critic_losses(params, self.buffers, batch, noise)
        step_members(params, critic_losses, self._critic_rows, stepping, limit,
                     [algos[m].critic_optimizer for m in stepping])
        out: dict[int, dict[str, Any]] = {}
        for m in stepping:
            algos[m].gradient_updates += 1
            storages[m].update_priorities(draws[m][0].indices, errors[m])
            out[m] = {"value_loss": critic_losses[m].detach(), "q_mean": q_means[m]}
        delayed = [m for m in stepping if algos[m].gradient_updates % algos[m].policy_delay == 0]
        if delayed:  # the policy climbs the critics just stepped, through their (detached) weights
            frozen = {k: v.detach() if k.startswith("critics.") else v for k, v in params.items()}
            policy_losses = self._actor_losses(frozen, self.buffers, batch[0])
            step_members(params, policy_losses, self._policy_rows, delayed, limit,
                         [algos[m].policy_optimizer for m in delayed])
            polyak_members(self._targets, [algos[m].tau if m in delayed else 0.0 for m in range(len(algos))])
            for m in delayed:
                out[m]["policy_loss"] = policy_losses[m].detach()
        return out
