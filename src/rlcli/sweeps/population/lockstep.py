"""A population of an algorithm written for a runner (algos/runner.py): the algorithm's own `_gradient_step`
(off-policy, once per gradient step) or `_update` (on-policy, once per update on the members' stacked rollouts),
called for all members, with `MembersRun` as its runner.

Nothing here is written per algorithm. The members' weights are stacked (each member's networks hold views of its
row, so its checkpoints, tests and export read its own); each member samples its batch and makes its draws from its
own torch stream, in its single run's order; a LossStep's loss is the algorithm's own, vectorized over the members'
weights by `vmap` through `functional_call`, and each member's own optimizer steps its row (with its own clip and
learning rate); a target network follows its source at each member's own `tau`. The members step in lockstep: they
are one population because their settings agree (but for the seed, lr, tau and max_grad_norm), and their step
counters are equal. compile=true: each LossStep of all members is one compiled graph (compiled.py). Eagerly, where
the networks are linear layers (and layer norms), a loss runs once on the members' stacked rows with one batched
product per layer and each mean per member (acting.py's stand-ins, algos/base.members_first), which the first call
checks against vmap bit for bit (acting.CheckedFastPath); and members that share their optimizer's settings step it as
one call (optimizer_states.StackedStep). An off-policy member acts with its own `act`, in turn; on-policy members act
together (acting.MembersActing). The offline algorithms, TD3 and DDPG are written this way (offline populations learn
over one copy of the dataset: offline/replay.py shares it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Protocol, TypeVar

import torch
from torch import nn
from torch.func import functional_call, vmap

from rlcli.algos.base import members_first
from rlcli.algos.compiled import NetworksCall
from rlcli.algos.loss_step import LossStep, compile_enabled
from rlcli.algos.offpolicy import gradient_steps_now, mean_of_steps
from rlcli.algos.runner import Tally, finish_phase, read_owner
from rlcli.batches import ReplayBatch, RolloutBatch
from rlcli.buffers.her import HerReplayBuffer
from rlcli.buffers.replay import ReplayBuffer
from rlcli.buffers.rollout import RolloutBuffer
from rlcli.contracts import PopulationKind, RunClock
from rlcli.registry import ConfigError
from rlcli.sweeps.population.acting import CheckedFastPath, MembersActing, call_swapped, members_swaps, same_losses
from rlcli.sweeps.population.catalog import can_batch, declared_kind
from rlcli.sweeps.population.compiled import CompiledMembersStep, one_optimizer_rule
from rlcli.sweeps.population.optimizer_states import StackedStep
from rlcli.sweeps.population.stacking import (
    clip_limits,
    members_mask,
    polyak_members,
    stack_members,
    stack_weights,
    step_members,
)
from rlcli.sweeps.population.streams import Stream, drawn_with

T = TypeVar("T")

# what members of one lockstep population may differ in (beside the seed and lr, which their own optimizers hold):
# each member's clip and Polyak rate are its own, its discount is in its own storage's batches (a runner's losses
# read `batch.discounts`, never `self.gamma`), and it acts with its own exploration noise; an algorithm adds those its
# step reads per member (`member_settings`: through run.read and run.only); anything else its step reads is the first
# member's
OWN_SETTINGS = {"tau": "tau", "max_grad_norm": "max_grad_norm", "gamma": "gamma", "noise.std": "noise_std"}
# settings whose null turns a branch of the step off (PPO's early stop, KL penalty, clipping), where the first member's
# value decides for all: the members must agree on null (a mix was no early stop for any member, or a traceback)
NULL_TOGGLES = ("target_kl", "kl_coef", "clip_range")
COUNTERS = frozenset({"gradient_updates"})  # each member's own (a step runs once per group of equal counters)


def batched_lockstep() -> str:
    return f"{can_batch('lockstep')} (MLP or CNN networks, buffer=replay, nstep, per, ere or her)"


def batched_on_policy() -> str:
    return f"{can_batch('on_policy')} (MLP or CNN actors)"


def population_update(algos: Sequence[Any], storages: Sequence[Any]) -> LockstepPopulation:
    """The members' batched update, as their algorithm's registered spec declares its kind (`AlgoSpec.population`,
    catalog.py), or a ConfigError saying in one line why these members cannot batch."""
    classes = {type(a) for a in algos}
    if len(classes) > 1:
        raise ConfigError(f"the members run different algorithms ({sorted(k.__name__ for k in classes)})")
    kind, name = declared_kind(algos[0]), type(algos[0]).__name__
    refusal = algos[0].population_refusal() if hasattr(algos[0], "population_refusal") else None
    if kind is None and refusal is not None:  # (algo.groups: a run of several algorithms, not one registered)
        raise ConfigError(f"{refusal} cannot train in a population yet; {can_batch()} without it can")
    if kind is None:
        raise ConfigError(f"{name} cannot train in a population yet: {can_batch()} can")
    steps = ("_update", "act_on") if kind == "on_policy" else ("_gradient_step",)  # what the kind's update calls
    if missing := [step for step in steps if not callable(getattr(algos[0], step, None))]:
        raise ConfigError(f"{name} declares population={kind!r} but has no {', '.join(missing)} (algos/runner.py): "
                          f"it cannot train in a population yet; {can_batch(kind)} can")
    return LockstepPopulation(algos, storages, kind)


class Population(Protocol):
    """What the population's loop uses of its update: a LockstepPopulation, or groups.GroupedPopulation (one per group
    of agents)."""

    acting: MembersActing | None

    def update(self, active: Sequence[bool], storages: Sequence[Any], torch_rngs: list[Stream],
               clocks: Sequence[RunClock | None] = ()) -> list[dict[str, torch.Tensor] | None]: ...


class LockstepPopulation:
    """The members' stacked weights and what their steps need: which weights each LossStep trains (by the
    LossStep's attribute name, the same in every member), each target network's (target, source) weight pairs."""

    def __init__(self, algos: Sequence[Any], storages: Sequence[Any], kind: PopulationKind) -> None:
        self.rollout = kind == "on_policy"  # its `_update` on a rollout; else its `_gradient_step` on a batch
        if self.rollout:
            _check_members(algos, storages, (RolloutBuffer,), batched_on_policy())
        else:
            _check_members(algos, storages, (ReplayBuffer, HerReplayBuffer), batched_lockstep())
        _check_lockstep(algos)
        self.algos = list(algos)
        self.params, self.buffers = stack_weights([a.networks for a in algos])
        self.rows = {name: [a.networks.get_parameter(name) for a in algos] for name in self.params}
        self.device = next(iter(self.params.values())).device
        self.steps = {name: _step_names(algos[0], step) for name, step in vars(algos[0]).items()
                      if isinstance(step, LossStep)}
        for names in self.steps.values():
            for name in names:
                self.params[name].requires_grad_(True)
        self._losses: dict[tuple[int, str, tuple[Any, ...]], Callable[..., Any]] = {}
        # the eager step: each loss on the stacked rows where that gives vmap's numbers (checked at its first call),
        # and the members' optimizer steps as one call where they share their settings
        self.direct: dict[tuple[int, str, tuple[Any, ...]], CheckedFastPath] = {}
        self.stacked_steps: dict[str, StackedStep | None] = {}
        self.attrs: dict[int, str] = {}  # a LossStep's attribute name, by the step's id
        self.step_params: dict[str, dict[str, torch.Tensor]] = {}  # the weights a LossStep's loss reads
        # compile=true members (all or none: compile is part of the population key): each LossStep of all members
        # one compiled graph, built at its first call
        self.compiled: dict[str, CompiledMembersStep] | None = {} if compile_enabled(algos[0]) else None
        if self.compiled is not None:  # (a member whose compiled steps update buffers, CrossQ's, is refused before)
            _check_one_optimizer(algos)
        # on-policy members act together: one forward for all, each member's draws from its own stream (None: each
        # member acts with its own `act` on its rows, under its own stream: its single run's actions and draws)
        self.acting = MembersActing(algos, self.params, self.buffers) if self.rollout else None

    def update(self, active: Sequence[bool], storages: Sequence[Any], torch_rngs: list[Stream],
               clocks: Sequence[RunClock | None] = ()) -> list[dict[str, torch.Tensor] | None]:
        """Each active member's update phase (None for the others), its steps taken with the others', then its own
        `finish_update` where the algorithm has one (algos/runner.py)."""
        if self.rollout:
            return self._rollout_update(active, storages, torch_rngs, list(clocks) or [None] * len(self.algos))
        results = update_phases(self.algos, storages, active, clocks, partial(self._step, storages, torch_rngs))
        for m, (algo, storage, clock, metrics) in enumerate(zip(self.algos, storages, clocks, results, strict=True)):
            if metrics is not None and clock is not None and len(storage) > 0:  # as single_run_update
                results[m] = finish_phase(algo, clock, metrics)
        return results

    def _rollout_update(self, active: Sequence[bool], storages: Sequence[Any], torch_rngs: list[Stream],
                        clocks: Sequence[RunClock | None]) -> list[dict[str, torch.Tensor] | None]:
        """The active on-policy members' updates as one: the algorithm's `_update` on their stacked rollouts (as
        single_rollout_update: then each member's own `finish_update`)."""
        results: list[dict[str, torch.Tensor] | None] = [None] * len(self.algos)
        stepping = [m for m, on in enumerate(active) if on]
        if not stepping:
            return results
        rollouts = {m: tuple(storages[m].flat()) for m in stepping}  # one size: n_steps, num_envs are in the key
        batch = RolloutBatch(*stack_members(rollouts, len(self.algos)))
        first = self.algos[stepping[0]]
        metrics = first._update(batch, MembersRun(self, stepping, storages[stepping[0]], torch_rngs))
        for m in stepping:
            results[m] = finish_phase(self.algos[m], clocks[m], {k: v[m] for k, v in metrics.items()})
        return results

    def _step(self, storages: Sequence[Any], torch_rngs: list[Stream], stepping: list[int], k: int,
              steps: list[int]) -> dict[int, dict[str, torch.Tensor]]:
        """The stepping members' k-th gradient step of the phase: one call of the algorithm's step per group of members
        whose step counters agree (all of them, but after a member stepped alone: a phase of its own with
        train_freq_unit=episode, a rollback), since the step branches on its counter (TD3's policy delay, SAC's
        target interval)."""
        algos, members = self.algos, len(self.algos)
        groups: dict[int, list[int]] = {}
        for m in stepping:
            groups.setdefault(algos[m].gradient_updates, []).append(m)
        out = {}
        for group in groups.values():
            batches = {m: drawn_with(torch_rngs, m, partial(storages[m].sample, algos[m].batch_size, k, steps[m]))
                       for m in group}
            batch = ReplayBatch(*stack_members({m: tuple(b) for m, b in batches.items()}, members))
            first = algos[group[0]]
            errors, metrics = first._gradient_step(batch, MembersRun(self, group, storages[group[0]], torch_rngs))
            for m in group:
                algos[m].gradient_updates = first.gradient_updates  # the counter it kept, as each single run's
                if errors is not None:
                    storages[m].update_priorities(batches[m].indices, errors[m])
                out[m] = {name: value[m] for name, value in metrics.items()}
        return out

    def members_loss(self, algo: Any, attr: str, args: Sequence[Any]) -> Callable[..., Any]:
        """`algo`'s LossStep `attr`'s loss over all members: (params, buffers, *args) -> stacked (loss, aux)."""
        dims = tuple(_in_dim(a) for a in args)
        key = (id(algo), attr, dims)
        if key not in self._losses:
            module = NetworksCall(algo.networks, getattr(algo, attr).loss)

            def member(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], *member_args: Any) -> Any:
                weights = {f"networks.{k}": v for k, v in {**params, **buffers}.items()}
                return functional_call(module, weights, member_args, tie_weights=False)

            self._losses[key] = vmap(member, in_dims=(0, 0, *dims))
        return self._losses[key]

    def eager_loss(self, algo: Any, attr: str, args: Sequence[Any],
                   params: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Any]:
        """The members' (losses, aux) of `algo`'s LossStep `attr`: on their stacked rows, or vmap's (see the module
        docstring). A loss that updates buffers or draws, or networks of other layers, always take vmap's."""
        step: LossStep = getattr(algo, attr)
        key = (id(algo), attr, tuple(_in_dim(a) for a in args))
        if key not in self.direct:
            swaps = None if step.updates_buffers else members_swaps(algo.networks, self.params)
            self.direct[key] = CheckedFastPath(None if swaps is None else
                                               partial(_rows_loss, step.loss, swaps, len(self.algos)),
                                               shape_errors=(RuntimeError, IndexError, ValueError))
        trained = tuple(params[name] for name in self.steps[attr])
        vmapped = partial(self.members_loss(algo, attr, args), params, self.buffers, *args)
        out: tuple[torch.Tensor, Any] = self.direct[key](vmapped, partial(same_losses, inputs=trained), *args)
        return out

class MembersRun:
    """A runner (algos/runner.py) for the members in `stepping`: every tensor carries a leading members axis (an
    idle member's rows are computed with its weights, never stepped). `first`: the algorithm whose step runs."""

    def __init__(self, population: LockstepPopulation, stepping: list[int], storage: Any,
                 torch_rngs: list[Stream], first: Any = None) -> None:
        self.population, self.stepping, self.storage, self.torch_rngs = population, stepping, storage, torch_rngs
        self.first = population.algos[stepping[0]] if first is None else first
        self._on: torch.Tensor | None = None

    def __call__(self, step: LossStep, *args: Any) -> tuple[torch.Tensor, Any]:
        pop, first = self.population, self.first
        attr = pop.attrs.get(id(step)) or next(name for name, value in vars(first).items() if value is step)
        pop.attrs[id(step)] = attr
        trained = pop.steps[attr]
        if attr not in pop.step_params:
            pop.step_params[attr] = {k: v if k in trained else v.detach() for k, v in pop.params.items()}
        params = pop.step_params[attr]
        steps = [getattr(a, attr) for a in pop.algos]
        limit = clip_limits([s.max_grad_norm for s in steps], pop.device)
        if pop.compiled is not None:
            if attr not in pop.compiled:
                def members_losses(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                                   inputs: tuple[Any, ...]) -> tuple[torch.Tensor, Any]:
                    values, aux = pop.members_loss(first, attr, inputs)(params, buffers, *inputs)
                    return values, (values.detach(), aux)

                pop.compiled[attr] = CompiledMembersStep(members_losses, pop.params, pop.buffers,
                                                         {name: pop.rows[name] for name in trained},
                                                         [s.optimizer for s in steps], limit)
            pop.compiled[attr].limit = limit  # the clips as schedules set them now
            losses, aux = pop.compiled[attr].step(args, members_mask(self.stepping, len(pop.algos), pop.device))
            return losses, aux
        idle = [m for m in range(len(pop.algos)) if m not in self.stepping] if step.updates_buffers else []
        kept = {name: stacked[idle].clone() for name, stacked in pop.buffers.items()} if idle else {}
        losses, aux = pop.eager_loss(first, attr, args, params)
        with torch.no_grad():  # a loss that updates buffers (CrossQ's batch-renorm statistics): not an idle member's
            for name, rows in kept.items():
                pop.buffers[name][idle] = rows
        optimizers = [s.optimizer for s in steps]
        if attr not in pop.stacked_steps:
            pop.stacked_steps[attr] = StackedStep(pop.params, {name: pop.rows[name] for name in trained},
                                                  optimizers) if StackedStep.fits(optimizers) else None
        step_members(pop.params, losses, {name: pop.rows[name] for name in trained}, self.stepping, limit,
                     [optimizers[m] for m in self.stepping], pop.stacked_steps[attr])
        return losses, aux

    def draw(self, draw: Callable[[], T]) -> T:
        drawn = {m: drawn_with(self.torch_rngs, m, draw) for m in self.stepping}
        return stack_members(drawn, len(self.population.algos))  # type: ignore[no-any-return]

    def read(self, read: Callable[..., T], *rows: Any) -> T:
        """`read`, a method of the algorithm (or of an object it holds: its temperature), of every member, given its
        rows of `rows`: stacked [members, ...] (each member's networks hold views of its rows, so its own method reads
        its own weights and settings); a tuple or dict of them, each stacked; None where every member's is None."""
        held = read_owner(read, self.first)
        owners = [a if held is None else getattr(a, held) for a in self.population.algos]
        with torch.no_grad():
            values = [read.__func__(each, *(_row(r, m) for r in rows))  # type: ignore[attr-defined]
                      for m, each in enumerate(owners)]
        return _stacked(values, self.population.device, getattr(read, "__name__", "a setting"))  # type: ignore[no-any-return]

    def only(self, members: Callable[..., bool], *rows: Any) -> MembersRun | None:
        chosen = [m for m in self.stepping if members(self.population.algos[m], *(_row(r, m) for r in rows))]
        return MembersRun(self.population, chosen, self.storage, self.torch_rngs, self.first) if chosen else None

    def take(self, batch: Any, idx: torch.Tensor) -> Any:
        """Each member's rows of the stacked batch at its own indices (idx: [members, k])."""
        members, size = idx.shape[0], next(x for x in batch if x is not None).shape[1]
        rows = (idx + torch.arange(members, device=idx.device).unsqueeze(1) * size).reshape(-1)
        return type(batch)(*(None if x is None else x.flatten(0, 1).index_select(0, rows).reshape(members, -1,
                                                                                                  *x.shape[2:])
                             for x in batch))

    def tally(self, tally: Tally | None, stats: dict[str, torch.Tensor]) -> Tally:
        """The stepping members' metrics added to their sums (the others' stay as they were), their steps counted."""
        sums, count = ({}, 0) if tally is None else tally
        if len(self.stepping) == len(self.population.algos):  # every member steps: each its own row's sum
            return Tally({k: sums.get(k, 0.0) + v for k, v in stats.items()}, count + 1)
        if self._on is None:
            self._on = members_mask(self.stepping, len(self.population.algos), self.population.device)
        on = self._on > 0
        added = {k: torch.where(on, sums.get(k, 0.0) + v, sums[k] if k in sums else torch.zeros_like(v))
                 for k, v in stats.items()}
        return Tally(added, count + self._on)

    def polyak(self, target: nn.Module, source: nn.Module) -> None:
        pop, names = self.population, {id(module): name for name, module in self.first.networks.named_modules()}
        to, of = f"{names[id(target)]}.", f"{names[id(source)]}."
        pairs = [(pop.params[name], pop.params[of + name[len(to):]]) for name in pop.params if name.startswith(to)]
        polyak_members(pairs, [a.tau if m in self.stepping else 0.0 for m, a in enumerate(pop.algos)])

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], -1).mean(1)


def _rows_loss(loss: Callable[..., Any], swaps: Any, members: int,
               *args: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]] | None:
    """A LossStep's loss on the members' stacked rows: each mean per member (members_first), each member's scalar
    (a [members] tensor, a setting run.read gave) as [members, 1] so that it broadcasts over its rows; None where it
    does not give one value per member, and a dict of them for its logs (a loss that reduces some other way)."""
    given = tuple(a.unsqueeze(-1) if isinstance(a, torch.Tensor) and a.dim() == 1 else a for a in args)
    with members_first():
        value, aux = call_swapped(swaps, loss, *given)
    if not isinstance(aux, dict) or any(not isinstance(v, torch.Tensor) or v.shape != (members, 1)
                                        for v in (value, *aux.values())):
        return None
    return value.squeeze(-1), {k: v.squeeze(-1) for k, v in aux.items()}


def _in_dim(arg: Any) -> Any:
    """vmap's in_dims for an argument: 0 for a tensor, per entry for a tuple (None for a None entry)."""
    if isinstance(arg, torch.Tensor):
        return 0
    if isinstance(arg, tuple):
        dims = [_in_dim(a) for a in arg]
        return type(arg)(*dims) if hasattr(arg, "_fields") else tuple(dims)
    return None


def _row(value: Any, m: int) -> Any:
    """Member m's rows of a stacked value (a tensor, or a tuple of them and of Nones)."""
    if isinstance(value, torch.Tensor):
        return value[m]
    if isinstance(value, tuple):
        rows = [_row(v, m) for v in value]
        return type(value)(*rows) if hasattr(value, "_fields") else tuple(rows)
    return value


def _stacked(values: list[Any], device: torch.device, what: str) -> Any:
    """The members' values (numbers, tensors, or tuples and dicts of them; None) stacked member-first."""
    first = values[0]
    if all(v is None for v in values):
        return None
    if any(v is None for v in values):
        raise ConfigError(f"some members set what {what} reads and some leave it null: they cannot share updates")
    if isinstance(first, dict):
        return {k: _stacked([v[k] for v in values], device, what) for k in first}
    if isinstance(first, tuple):
        return tuple(_stacked([v[i] for v in values], device, what) for i in range(len(first)))
    return torch.stack([torch.as_tensor(v, device=device) for v in values])


def _check_members(algos: Sequence[Any], storages: Sequence[Any], storage_types: tuple[type, ...],
                   batchable: str) -> None:
    """One line naming what keeps these members out of a population (the launcher then runs them one by one): the
    algorithm's own `population_refusal` (a recurrent actor, add-ons, extra networks, CrossQ's compiled steps), or
    a storage not of `storage_types`. Uniform, n-step, prioritized, ERE and HER replay all draw their batches (HER:
    its relabelled goals too) from torch's CPU generator, which the population swaps to each member's stream.
    `batchable`: what can batch."""
    for algo, storage in zip(algos, storages, strict=True):
        refusal = algo.population_refusal() if hasattr(algo, "population_refusal") else None
        if refusal is not None:
            raise ConfigError(f"{refusal} cannot train in a population yet; {batchable} without it can")
        if not isinstance(storage, storage_types):
            raise ConfigError(f"{type(storage).__name__} storage cannot train in a population yet; {batchable} can")


def update_phases(algos: Sequence[Any], storages: Sequence[Any], active: Sequence[bool],
                  clocks: Sequence[RunClock | None],
                  gradient_step: Callable[[list[int], int, list[int]], dict[int, dict[str, torch.Tensor]]],
                  ) -> list[dict[str, torch.Tensor] | None]:
    """An off-policy update phase for every member at once, as `algos.offpolicy.run_gradient_steps` gives a single
    run: each member takes its single run's count of gradient steps, the population's steps in lockstep (a member
    with fewer drops out of the later ones; `gradient_step(stepping, k, counts)` gives each stepping member's
    metrics), and each member's metrics are the means of its steps' (None for an inactive member; {} for one whose
    storage holds nothing whole yet, which takes no step, as its single run)."""
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


def _check_one_optimizer(algos: Sequence[Any]) -> None:
    """compile=true: the compiled step applies one optimizer formula to every member's rows (compiled.py)."""
    for attr in [name for name, value in vars(algos[0]).items() if isinstance(value, LossStep)]:
        one_optimizer_rule([getattr(a, attr).optimizer for a in algos])


def _step_names(algo: Any, step: LossStep) -> dict[str, None]:
    """The names (in the networks) of the weights the LossStep's optimizer trains, in the networks' order (a set's
    order changes with the process's string hashes, and the members' gradient-norm clips sum in this order)."""
    trained = {id(p) for p in step.params}
    return {name: None for name, p in algo.networks.named_parameters() if id(p) in trained}


def _plain_settings(algo: Any, prefix: str = "") -> dict[str, Any]:
    """The algorithm's plain settings and counters, and those of the rlcli objects it holds (SAC's temperature)."""
    plain: dict[str, Any] = {}
    for key, value in vars(algo).items():
        if isinstance(value, (bool, int, float, str, type(None))):
            plain[prefix + key] = value
        elif not prefix and type(value).__module__.startswith("rlcli.") and hasattr(value, "__dict__") \
                and not isinstance(value, (nn.Module, LossStep)):
            plain |= _plain_settings(value, f"{key}.")
    return plain


def _check_lockstep(algos: Sequence[Any]) -> None:
    """One line naming what keeps these members out of one lockstep population."""
    first = _plain_settings(algos[0])
    own = OWN_SETTINGS | getattr(algos[0], "member_settings", {})  # the algorithm's attribute -> its setting's name
    plain = [first, *(_plain_settings(algo) for algo in algos[1:])]
    for attr in NULL_TOGGLES:  # null turns a step's branch off, as the first member has it: all set it or none does
        setting = own.get(attr, attr)
        values = ["null" if p.get(attr) is None else str(p[attr]) for p in plain]
        if "null" in values and any(v != "null" for v in values):
            raise ConfigError(f"some members set algo.{setting} and some leave it null ({', '.join(values)}): "
                              "members batch when all set it or none does")
    for other in plain[1:]:
        differ = sorted(k for k in first.keys() | other.keys()
                        if k not in own and k not in COUNTERS and first.get(k) != other.get(k))
        if differ:
            may = ", ".join(sorted(set(own.values())))
            raise ConfigError(f"the members differ in {', '.join(differ)}: {type(algos[0]).__name__} members batch "
                              f"when they differ only in seed, lr, {may}")
