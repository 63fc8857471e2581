"""PPO's update for a whole population: every member's minibatch loss and gradients in one vectorized call.

The loss is PPO's own `minibatch_loss` (one member's code, called through `torch.func.functional_call` with the
stacked weights and vectorized over members by `vmap`), so the population computes what a single run computes.
Each member keeps its own minibatch order (drawn from its own torch RNG stream, as its single run would), its
own gradient-norm clip, learning rate and Adam state; members that have stopped are carried along but not
stepped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, vmap

from rlcli.actors.recurrent import RecurrentActorCritic
from rlcli.algos.exploration import minibatches
from rlcli.algos.ppo import PPO, UpdatePlan
from rlcli.buffers.rollout import RolloutBatch, RolloutBuffer
from rlcli.optim import step_together
from rlcli.population.stacking import stack_weights
from rlcli.registry import ConfigError

BATCH_FIELDS = 7  # RolloutBatch's tensors for an MLP or CNN actor (obs ... mask); the rest are None here


def check_batchable(algo: Any) -> None:
    """One line naming what keeps this algorithm out of a population (the launcher then runs it alone)."""
    if not isinstance(algo, PPO):
        raise ConfigError(f"{type(algo).__name__} cannot train in a population yet: ppo can (and a sweep of "
                          "anything else runs one job at a time)")
    reasons = [(isinstance(algo.networks, RecurrentActorCritic), "a recurrent actor"),
               (algo.kl_coef is not None, "the KL penalty (ppo_kl)"),
               (algo.target_kl is not None, "algo.target_kl (members would stop their epochs at different times)"),
               (bool(algo.policy_addons), "algo.policy_loss_addons"),
               (bool(algo.extra_param_groups(1.0)), f"{type(algo).__name__}'s extra networks"),
               (algo.noise_resampling.noise is not None, "gSDE (algo.use_sde)"),
               (algo._compiled is not None, "compile=true")]
    for bad, what in reasons:
        if bad:
            raise ConfigError(f"{what} cannot train in a population yet; plain ppo (MLP or CNN actor) can")


class _MemberLoss(nn.Module):
    """PPO's minibatch loss as a module call, so that functional_call can swap in one member's weights."""

    def __init__(self, algo: PPO) -> None:
        super().__init__()
        self.networks = algo.networks
        self._algo = (algo,)  # a tuple, not a submodule: its networks are registered once, above

    def forward(self, batch: RolloutBatch, clip: torch.Tensor, ent_coef: torch.Tensor,
                vf_coef: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return self._algo[0].minibatch_loss(batch, clip, ent_coef, vf_coef)


class PopulationPPO:
    """The members' PPO updates as one; `update(active, buffers, rngs)` returns each member's metrics."""

    def __init__(self, algos: Sequence[PPO]) -> None:
        for algo in algos:
            check_batchable(algo)
        first = algos[0]
        if len({(a.n_epochs, a.batch_size, a.normalize_advantage, a.clip_range_vf is None) for a in algos}) > 1:
            raise ConfigError("the members differ in n_epochs, batch_size, normalize_advantage or clip_range_vf: "
                              "they cannot train as one population")
        self.algos = list(algos)
        self.params, self.buffers = stack_weights([a.networks for a in algos])
        self.names = list(self.params)
        module = _MemberLoss(first)

        def member_loss(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                        batch: tuple[torch.Tensor, ...], clip: torch.Tensor, ent_coef: torch.Tensor,
                        vf_coef: torch.Tensor) -> Any:
            weights = {f"networks.{k}": v for k, v in {**params, **buffers}.items()}
            return functional_call(module, weights, (RolloutBatch(*batch), clip, ent_coef, vf_coef))

        self._losses: Callable[..., Any] = vmap(member_loss)
        for stacked in self.params.values():
            stacked.requires_grad_(True)
        self._rows: dict[str, list[list[torch.Tensor]]] = {
            name: [[a.networks.get_parameter(name)] for a in algos] for name in self.names}

    def update(self, active: Sequence[bool], buffers: Sequence[RolloutBuffer],
               torch_rngs: list[torch.Tensor]) -> list[dict[str, torch.Tensor] | None]:
        """One PPO update of every active member (None for the others); `torch_rngs` are the members' torch RNG
        states, used for their minibatch order and advanced as their single runs would advance them."""
        algos = self.algos
        plans: list[UpdatePlan] = [a.begin_update(b) for a, b in zip(algos, buffers, strict=True)]
        size = plans[0].batch.mask.shape[0]
        if any(p.batch.mask.shape[0] != size for p in plans):
            raise ConfigError("the members' rollouts differ in size (n_steps x num_envs): they cannot share updates")
        clip = torch.tensor([p.clip for p in plans])
        ent_coef = torch.tensor([a.ent_coef for a in algos])
        vf_coef = torch.tensor([a.vf_coef for a in algos])
        max_norm = [a.max_grad_norm for a in algos]
        stacked = RolloutBatch(*(torch.stack([p.batch[i] for p in plans]) for i in range(BATCH_FIELDS)))
        sums: dict[str, torch.Tensor] = {}
        count = 0
        stepped = [a.optimizer for a, on in zip(algos, active, strict=True) if on]
        for _epoch in range(algos[0].n_epochs):
            orders = [list(self._minibatch_order(size, a.batch_size, torch_rngs, m)) for m, a in enumerate(algos)]
            for chunk in zip(*orders, strict=True):
                index = torch.stack(chunk)  # [members, minibatch]
                members = torch.arange(len(algos)).unsqueeze(1)
                batch = tuple(x[members, index] for x in stacked[:BATCH_FIELDS])
                for stacked_param in self.params.values():
                    stacked_param.grad = None
                losses, stats = self._losses(self.params, self.buffers, batch, clip, ent_coef, vf_coef)
                losses.sum().backward()  # the members are independent: each row's gradient is its own loss's
                grads = {name: stacked_param.grad for name, stacked_param in self.params.items()}
                self._clip(grads, max_norm)
                self._set_grads(grads)
                step_together(stepped)
                count += 1
                for k, v in stats.items():
                    sums[k] = sums[k] + v if k in sums else v
        means = {k: (v / count).unbind() for k, v in sums.items()}
        return [a.end_update(p, {k: v[m] for k, v in means.items()}) if on else None
                for m, (a, p, on) in enumerate(zip(algos, plans, active, strict=True))]

    @staticmethod
    def _minibatch_order(size: int, batch_size: int, torch_rngs: list[torch.Tensor], member: int) -> list[torch.Tensor]:
        outer = torch.get_rng_state()
        torch.set_rng_state(torch_rngs[member])
        try:
            return list(minibatches(size, batch_size, "cpu"))
        finally:
            torch_rngs[member] = torch.get_rng_state()
            torch.set_rng_state(outer)

    def _clip(self, grads: dict[str, torch.Tensor], max_norm: list[float | None]) -> None:
        """Each member's global gradient-norm clip (torch's clip_grad_norm_ formula, one norm per member)."""
        if all(m is None for m in max_norm):
            return
        norms = torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads.values()])
        total = torch.linalg.vector_norm(norms, dim=0)
        limit = torch.tensor([float("inf") if m is None else m for m in max_norm])
        scale = torch.clamp(limit / (total + 1e-6), max=1.0)
        for g in grads.values():
            g.mul_(scale.view(-1, *([1] * (g.dim() - 1))))

    def _set_grads(self, grads: dict[str, torch.Tensor]) -> None:
        for name, g in grads.items():
            for member, (param,) in enumerate(self._rows[name]):
                param.grad = g[member]

