"""The on-policy family's update for a whole population: every member's loss and gradients in one vectorized
call.

The loss is the algorithm's own `minibatch_loss`, so a population computes what single runs compute. Eager, the
part of it that reads the networks (`evaluate_minibatch`) runs for all members at once as one batched product per
layer (acting.py's MembersForward; vmap over `functional_call` where the networks have other weights), and the rest
is the same `minibatch_loss` called on the members' stacked rows with per-member means (members_loss.py; vmap where
that does not give vmap's numbers); compiled (compiled.py), the whole loss goes through `functional_call` with the
stacked weights under `vmap`. The algorithm gives its update in parts (`begin_update`, `loss_terms`,
`minibatch_order`, `minibatch_loss`, `stops_after_epoch`, `end_update`: PPO, A2C, PG); each member keeps its own
minibatch order (drawn from its own torch RNG stream, as its single run draws it), gradient-norm clip, learning
rate, optimizer state and early stop (algo.target_kl: its epochs end where its single run's would). Members that
have stopped are carried along but not stepped.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any, Protocol, cast, runtime_checkable

import torch
from torch import nn
from torch.func import vmap

from rlcli.algos.base import UpdatePlan
from rlcli.algos.loss_step import compile_enabled
from rlcli.batches import RolloutBatch
from rlcli.buffers.rollout import RolloutBuffer
from rlcli.contracts import ActOutput, RunClock
from rlcli.registry import ConfigError
from rlcli.sweeps.population.acting import MembersForward
from rlcli.sweeps.population.catalog import can_batch
from rlcli.sweeps.population.compiled import CompiledMembersStep
from rlcli.sweeps.population.members_loss import MembersLoss
from rlcli.sweeps.population.optimizer_states import StackedStep
from rlcli.sweeps.population.stacking import clip_limits, stack_weights, step_members, vmapped
from rlcli.sweeps.population.streams import Stream, drawn_with

BATCH_FIELDS = 7  # RolloutBatch's tensors for an MLP or CNN actor (obs ... mask); the rest are None here


@runtime_checkable
class BatchableUpdate(Protocol):
    """An on-policy algorithm whose update a population can run for many members at once."""

    networks: nn.Module
    optimizer: Any
    max_grad_norm: float | None

    def begin_update(self, buffer: RolloutBuffer) -> UpdatePlan: ...

    def loss_terms(self, plan: UpdatePlan) -> dict[str, float | None]: ...

    def minibatch_order(self, size: int, device: torch.device | str = "cpu") -> Iterator[list[torch.Tensor]]: ...

    def stops_after_epoch(self, approx_kls: list[torch.Tensor]) -> bool: ...

    def epochs_may_stop(self) -> bool: ...

    def evaluate_minibatch(self, batch: RolloutBatch) -> tuple[torch.Tensor, ...]: ...

    def minibatch_loss(self, batch: RolloutBatch, **terms: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...

    def end_update(self, plan: UpdatePlan, metrics: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]: ...

    def act_on(self, params: torch.Tensor, values: torch.Tensor, deterministic: bool = False,
               uniforms: torch.Tensor | None = None) -> ActOutput: ...

    def population_refusal(self) -> str | None: ...


def batched_algos() -> str:
    return f"{can_batch('on_policy')} (MLP or CNN actors)"


def check_batchable(algos: Sequence[Any]) -> None:
    """One line naming what keeps these members out of a population (the launcher then runs them one by one)."""
    if not isinstance(algos[0], BatchableUpdate):
        raise ConfigError(f"{type(algos[0]).__name__} cannot train in a population of on-policy members: "
                          f"{batched_algos()} can")
    for member in algos:
        refusal = member.population_refusal()
        if refusal is not None:
            raise ConfigError(f"{refusal} cannot train in a population yet; {batched_algos()} without it can")


class _MemberLoss(nn.Module):
    """The algorithm's minibatch loss as a module call, so that functional_call can swap in a member's weights."""

    def __init__(self, algo: BatchableUpdate) -> None:
        super().__init__()
        self.networks = algo.networks
        self._algo = (algo,)  # a tuple, not a submodule: its networks are registered once, above
        self.unset_terms: dict[str, None] = {}  # coefficients every member leaves null (vmap takes tensors only)

    def forward(self, batch: tuple[torch.Tensor, ...],
                terms: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
        return self._algo[0].minibatch_loss(RolloutBatch(*batch), **terms, **self.unset_terms)


class _MemberAct(nn.Module):
    """Acting's arithmetic (the policy head's parameters and the values) as a module call, for functional_call."""

    def __init__(self, networks: nn.Module) -> None:
        super().__init__()
        self.networks = networks

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out: tuple[torch.Tensor, torch.Tensor] = self.networks.policy_and_values(obs)  # type: ignore[operator]
        return out


class _MemberEvaluate(nn.Module):
    """The part of the minibatch loss that reads the networks (`evaluate_minibatch`) as a module call, for
    MembersForward."""

    def __init__(self, algo: BatchableUpdate) -> None:
        super().__init__()
        self.networks = algo.networks
        self._algo = (algo,)  # a tuple, not a submodule: its networks are registered once, above

    def forward(self, batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return self._algo[0].evaluate_minibatch(RolloutBatch(*batch))


class PopulationUpdate:
    """The members' acting and updates as one: `policy_and_values` for all members' observations at once,
    `update(active, buffers, torch_rngs)` for all their updates (each member's metrics back)."""

    def __init__(self, algos: Sequence[Any]) -> None:
        check_batchable(algos)
        self.algos: list[BatchableUpdate] = list(algos)
        self.params, self.buffers = stack_weights([a.networks for a in algos])
        for stacked in self.params.values():
            stacked.requires_grad_(True)
        self._module = _MemberLoss(self.algos[0])
        self._losses = vmapped(self._module)
        member_act = _MemberAct(self.algos[0].networks)
        vmapped_act = vmapped(member_act)
        self._act = MembersForward(member_act.networks, self.params, member_act,
                                   lambda obs: vmapped_act(self.params, self.buffers, obs))
        self._rows = {name: [a.networks.get_parameter(name) for a in algos] for name in self.params}
        # the eager step: the networks' part of the loss for all members as one batched product per layer (as
        # acting), then the rest of the algorithm's loss vectorized over members; vmap over functional_call of the
        # whole loss spent ~0.9 ms more per 8-member PPO minibatch step (125 against 107 ms per 20-step update)
        member_evaluate = _MemberEvaluate(self.algos[0])
        vmapped_evaluate = vmapped(member_evaluate)
        self._evaluate = MembersForward(member_evaluate.networks, self.params, member_evaluate,
                                        lambda batch: vmapped_evaluate(self.params, self.buffers, batch))
        self._losses_given = MembersLoss(self._loss_given, vmap(self._loss_given))
        # members whose acting draws can be taken apart (a categorical head's uniforms) act in one call
        self._draws_apart = all(_takes_uniforms(a) for a in self.algos)
        self._compiled: CompiledMembersStep | None = None
        self._stacked_step: StackedStep | None = None
        if all(compile_enabled(a) for a in self.algos):  # compile=true is part of the population key: all or none
            self._compiled = CompiledMembersStep(self._losses, self.params, self.buffers, self._rows,
                                                 [a.optimizer for a in self.algos],
                                                 clip_limits([a.max_grad_norm for a in self.algos],
                                                             next(iter(self.params.values())).device))
        elif StackedStep.fits([a.optimizer for a in self.algos]):
            self._stacked_step = StackedStep(self.params, self._rows, [a.optimizer for a in self.algos])

    @torch.inference_mode()
    def policy_and_values(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[members, envs, ...] observations -> each member's policy-head parameters and values, one call."""
        out: tuple[torch.Tensor, torch.Tensor] = self._act(obs)
        return out

    def acting_noise(self, member: int, outputs: torch.Tensor) -> torch.Tensor | None:
        """The member's acting draw for its rows of the batched policy-head outputs, from torch's global generator
        (the caller swaps the member's stream in): the uniforms its single run's `act_on` draws there. None where
        the member acts alone (`act_on`): a head that draws otherwise (a Gaussian's, gSDE's), an algorithm whose
        `act_on` takes no draw (PQN's epsilon-greedy)."""
        if not self._draws_apart:
            return None
        draw: torch.Tensor | None = self.algos[member].networks.draw(outputs)  # type: ignore[operator]
        return draw

    @torch.inference_mode()
    def act_members(self, outputs: torch.Tensor, draws: dict[int, torch.Tensor],
                    values: torch.Tensor | None = None) -> dict[int, ActOutput]:
        """The actions of the members in `draws`, in one `act_on` call over their stacked rows of `outputs` and
        `values` (elementwise: each member's actions and log-probabilities are its own `act_on`'s, bit for bit)."""
        assert values is not None
        members = list(draws)
        rows = outputs if len(members) == outputs.shape[0] else outputs[members]
        value_rows = values if len(members) == values.shape[0] else values[members]
        out = self.algos[members[0]].act_on(rows, value_rows, uniforms=torch.stack([draws[m] for m in members]))
        return {m: ActOutput(out.actions[k], out.log_probs[k], out.values[k]) for k, m in enumerate(members)}

    @torch.inference_mode()
    def act_deterministically(self, outputs: torch.Tensor, values: torch.Tensor,
                              members: list[int]) -> dict[int, ActOutput] | None:
        """The deterministic actions of `members` (a test phase's) in one `act_on` call over their stacked rows, where
        the members' heads are categorical (an argmax per row: each member's own `act_on`'s, bit for bit); None for
        the others, which act member by member."""
        if not self._draws_apart:
            return None
        rows = outputs if len(members) == outputs.shape[0] else outputs[members]
        value_rows = values if len(members) == values.shape[0] else values[members]
        out = self.algos[members[0]].act_on(rows, value_rows, deterministic=True)
        return {m: ActOutput(out.actions[k], out.log_probs[k], out.values[k]) for k, m in enumerate(members)}

    def _loss_given(self, batch: tuple[torch.Tensor, ...], evaluated: tuple[torch.Tensor, ...],
                    terms: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
        """One member's minibatch loss, its networks' outputs given (vmap's per-member function)."""
        return self.algos[0].minibatch_loss(RolloutBatch(*batch), **terms, **self._module.unset_terms,
                                            evaluated=evaluated)

    def update(self, active: Sequence[bool], buffers: Sequence[Any], torch_rngs: list[Stream],
               clocks: Sequence[RunClock | None] = ()) -> list[dict[str, torch.Tensor] | None]:
        """One update of every active member (None for the others); `torch_rngs` are the members' torch RNG
        states, used for their minibatch order and advanced as their single runs would advance them. (`clocks`:
        the members' run clocks, which an on-policy update does not read.)"""
        algos = self.algos
        plans = [a.begin_update(b) for a, b in zip(algos, buffers, strict=True)]
        size = plans[0].batch.mask.shape[0]
        if any(p.batch.mask.shape[0] != size for p in plans):
            raise ConfigError("the members' rollouts differ in size (n_steps x num_envs): they cannot share updates")
        device = plans[0].batch.mask.device
        terms = _stacked_terms([a.loss_terms(p) for a, p in zip(algos, plans, strict=True)], device)
        self._module.unset_terms = {k: None for k, v in terms.items() if v is None}
        terms = {k: v for k, v in terms.items() if v is not None}
        # each field as one [members x size, ...] tensor: a minibatch is one index_select per field
        flat = tuple(torch.cat([cast(torch.Tensor, p.batch[i]) for p in plans]) for i in range(BATCH_FIELDS))
        # each member's epochs, drawn from its own stream as each begins (an epoch after algo.target_kl stopped
        # the member is never drawn, as in its single run)...
        orders = [a.minibatch_order(size, device) for a in algos]
        # ...but a member whose every epoch runs draws all their orders at once, in one turn of its stream (its
        # single run draws nothing else in between, so the numbers are the same; a turn takes ~30 us)
        drawn = {m: iter(drawn_with(torch_rngs, m, partial(list, orders[m])))
                 for m, a in enumerate(algos) if active[m] and not a.epochs_may_stop()}
        offsets = torch.arange(len(algos), device=device).unsqueeze(1) * size  # each member's first row in `flat`
        limit = clip_limits([a.max_grad_norm for a in algos], device)
        going = list(active)
        names: list[str] = []
        sums: torch.Tensor | None = None  # [stats, members]: each stepping member's sums of its minibatches' logs
        counts = torch.zeros(len(algos), device=device)
        while True:
            epoch = {m: next(drawn[m], None) if m in drawn else
                     drawn_with(torch_rngs, m, partial(next, orders[m], None)) for m, on in enumerate(going) if on}
            epoch = {m: chunks for m, chunks in epoch.items() if chunks is not None}
            if not epoch:
                break
            filler = next(iter(epoch.values()))  # the rows of a member not stepping: computed, never applied
            on = torch.tensor([m in epoch for m in range(len(algos))], device=device)
            stepping, stepped = on.float(), [algos[m].optimizer for m in epoch]
            kls: list[torch.Tensor] = []  # the epoch's minibatches' [members] approximate KLs
            for chunk in zip(*(epoch.get(m, filler) for m in range(len(algos))), strict=True):
                rows = (torch.stack(chunk) + offsets).reshape(-1)  # [members x minibatch] rows of `flat`
                batch = tuple(x.index_select(0, rows).reshape(len(algos), -1, *x.shape[1:]) for x in flat)
                if self._compiled is not None:
                    stats = self._compiled.step(batch, terms, stepping)
                else:
                    losses, stats = self._losses_given(batch, self._evaluate(batch), terms)
                    step_members(self.params, losses, self._rows, list(epoch), limit, stepped, self._stacked_step)
                counts += stepping
                names, values = list(stats), torch.stack(list(stats.values()))  # [stats, members]
                sums = torch.where(on, sums + values, sums) if sums is not None else torch.where(on, values, 0.0)
                if "approx_kl" in stats:
                    kls.append(stats["approx_kl"])
            per_member = torch.stack(kls, 1).unbind() if kls else [torch.zeros(0)] * len(algos)
            for m in epoch:
                going[m] = not algos[m].stops_after_epoch(list(per_member[m].unbind()))
        means = dict(zip(names, (sums / counts.clamp(min=1.0)).unbind(), strict=True)) if sums is not None else {}
        return [a.end_update(p, {k: v[m] for k, v in means.items()}) if on else None
                for m, (a, p, on) in enumerate(zip(algos, plans, active, strict=True))]


def _takes_uniforms(algo: Any) -> bool:
    """Whether the algorithm's `act_on` acts on a draw taken beforehand (PPO's, A2C's, PG's) and its policy head
    draws apart (`networks.draw`: a categorical head)."""
    networks = algo.networks
    return ("uniforms" in inspect.signature(type(algo).act_on).parameters and callable(getattr(networks, "draw", None))
            and callable(getattr(getattr(networks, "head", None), "draw", None)))


def _stacked_terms(terms: list[dict[str, float | None]], device: torch.device) -> dict[str, Any]:
    """Each loss coefficient as a [members] tensor (a value the members all leave None stays None)."""
    out: dict[str, Any] = {}
    for key in terms[0]:
        values = [t[key] for t in terms]
        if all(v is None for v in values):
            out[key] = None
        elif any(v is None for v in values):
            raise ConfigError(f"some members set {key} and some leave it null: they cannot share updates")
        else:
            out[key] = torch.tensor(values, device=device)
    return out
