"""A population of an algorithm written for a runner (algos/runner.py): the algorithm's own `_gradient_step`, called
once per step for all members, with `MembersRun` as its runner.

Nothing here is written per algorithm. The members' weights are stacked (each member's networks hold views of its
row, so its checkpoints, tests and export read its own); each member samples its batch and makes its draws from its
own torch stream, in its single run's order; a LossStep's loss is the algorithm's own, vectorized over the members'
weights by `vmap` through `functional_call`, and each member's own optimizer steps its row (with its own clip and
learning rate); a target network follows its source at each member's own `tau`. The members step in lockstep: they
are one population because their settings agree (but for the seed, lr, tau and max_grad_norm), and their step
counters are equal. compile=true: each LossStep of all members is one compiled graph (compiled.py). Acting is each
member's own `act`, in turn. The offline algorithms, TD3 and DDPG are written this way (offline populations learn
over one copy of the dataset: offline/replay.py shares it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Protocol, TypeVar, runtime_checkable

import torch
from torch import nn
from torch.func import functional_call, vmap

from rlcli.algos.loss_step import LossStep, compile_enabled, loss_steps
from rlcli.algos.runner import finish_phase, read_owner
from rlcli.batches import ReplayBatch
from rlcli.contracts import ActOutput, RunClock
from rlcli.registry import ConfigError
from rlcli.sweeps.population.catalog import can_batch
from rlcli.sweeps.population.compiled import CompiledMembersStep
from rlcli.sweeps.population.phases import check_replay_members, update_phases
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
COUNTERS = frozenset({"gradient_updates"})  # each member's own (a step runs once per group of equal counters)


def batched_lockstep() -> str:
    return f"{can_batch('lockstep')} (MLP or CNN networks, buffer=replay, nstep, per, ere or her)"


@runtime_checkable
class WrittenForARunner(Protocol):
    """An algorithm whose gradient step goes through a runner (algos/runner.py), each of its optimizers' steps a
    LossStep attribute."""

    networks: nn.Module
    batch_size: int
    gradient_steps: int
    gradient_updates: int

    def _gradient_step(self, batch: Any, run: Any) -> Any: ...


class _StepLoss(nn.Module):
    """A LossStep's loss as a module call, so that functional_call can swap a member's weights into its networks."""

    def __init__(self, networks: nn.Module, loss: Callable[..., Any]) -> None:
        super().__init__()
        self.networks = networks
        self._loss = (loss,)  # a tuple, not a submodule: the networks are registered once, above

    def forward(self, *args: Any) -> Any:
        return self._loss[0](*args)


class LockstepPopulation:
    """The members' stacked weights and what their steps need: which weights each LossStep trains (by the
    LossStep's attribute name, the same in every member), each target network's (target, source) weight pairs."""

    def __init__(self, algos: Sequence[Any], storages: Sequence[Any]) -> None:
        if not isinstance(algos[0], WrittenForARunner):
            raise ConfigError(f"{type(algos[0]).__name__} does not step through a runner: {can_batch('lockstep')} do")
        check_replay_members(algos, storages, batched_lockstep())
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
        self._losses: dict[tuple[int, str, tuple[int | None, ...]], Callable[..., Any]] = {}
        # compile=true members (all or none: compile is part of the population key): each LossStep of all members
        # one compiled graph, built at its first call
        self.compiled: dict[str, CompiledMembersStep] | None = {} if compile_enabled(algos[0]) else None
        if self.compiled is not None and any(step.updates_buffers for step in loss_steps(algos[0])):
            raise ConfigError(f"{type(algos[0]).__name__} with compile=true updates buffers in its compiled steps, "
                              "which a compiled population does not cover yet")

    # acting: each member's own `act` on its rows, under its own stream (the caller swaps it in): its single run's
    # actions and draws, bit for bit; the network part is not batched (an offline member acts only in tests)
    @torch.inference_mode()
    def policy_and_values(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return obs, obs.new_zeros(obs.shape[:2])

    def acting_noise(self, member: int, outputs: torch.Tensor) -> ActOutput:
        with torch.inference_mode():
            out: ActOutput = self.algos[member].act(outputs)
        return out

    def act_members(self, outputs: torch.Tensor, draws: dict[int, ActOutput],
                    values: torch.Tensor | None = None) -> dict[int, ActOutput]:
        return draws

    @torch.inference_mode()
    def act_deterministically(self, outputs: torch.Tensor, values: torch.Tensor,
                              members: list[int]) -> dict[int, ActOutput]:
        return {m: self.algos[m].act(outputs[m], deterministic=True) for m in members}

    def update(self, active: Sequence[bool], storages: Sequence[Any], torch_rngs: list[Stream],
               clocks: Sequence[RunClock | None]) -> list[dict[str, torch.Tensor] | None]:
        """Each active member's update phase (None for the others), its steps taken with the others', then its own
        `finish_update` where the algorithm has one (algos/runner.py)."""
        results = update_phases(self.algos, storages, active, clocks, partial(self._step, storages, torch_rngs))
        for m, (algo, storage, clock, metrics) in enumerate(zip(self.algos, storages, clocks, results, strict=True)):
            if metrics is not None and clock is not None and len(storage) > 0:  # as single_run_update
                results[m] = finish_phase(algo, clock, metrics)
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
        dims = tuple(0 if isinstance(a, (torch.Tensor, tuple)) else None for a in args)
        key = (id(algo), attr, dims)
        if key not in self._losses:
            module = _StepLoss(algo.networks, getattr(algo, attr).loss)

            def member(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], *member_args: Any) -> Any:
                weights = {f"networks.{k}": v for k, v in {**params, **buffers}.items()}
                return functional_call(module, weights, member_args, tie_weights=False)

            self._losses[key] = vmap(member, in_dims=(0, 0, *dims))
        return self._losses[key]


class MembersRun:
    """A runner (algos/runner.py) for the members in `stepping`: every tensor carries a leading members axis (an
    idle member's rows are computed with its weights, never stepped). `first`: the algorithm whose step runs."""

    def __init__(self, population: LockstepPopulation, stepping: list[int], storage: Any,
                 torch_rngs: list[Stream], first: Any = None) -> None:
        self.population, self.stepping, self.storage, self.torch_rngs = population, stepping, storage, torch_rngs
        self.first = population.algos[stepping[0]] if first is None else first

    def __call__(self, step: LossStep, *args: Any) -> tuple[torch.Tensor, Any]:
        pop, first = self.population, self.first
        attr = next(name for name, value in vars(first).items() if value is step)
        trained = pop.steps[attr]
        params = {k: v if k in trained else v.detach() for k, v in pop.params.items()}
        steps = [getattr(a, attr) for a in pop.algos]
        limit = clip_limits([s.max_grad_norm for s in steps], pop.device)
        if pop.compiled is not None:
            if attr not in pop.compiled:
                def members_losses(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                                   inputs: tuple[Any, ...], terms: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Any]:
                    values, aux = pop.members_loss(first, attr, inputs)(params, buffers, *inputs)
                    return values, (values.detach(), aux)

                pop.compiled[attr] = CompiledMembersStep(members_losses, pop.params, pop.buffers,
                                                         {name: pop.rows[name] for name in trained},
                                                         [s.optimizer for s in steps], limit)
            pop.compiled[attr].limit = limit  # the clips as schedules set them now
            done: tuple[torch.Tensor, Any] = pop.compiled[attr].step(args, {}, members_mask(
                self.stepping, len(pop.algos), pop.device))
            return done
        idle = [m for m in range(len(pop.algos)) if m not in self.stepping] if step.updates_buffers else []
        kept = {name: stacked[idle].clone() for name, stacked in pop.buffers.items()} if idle else {}
        losses, aux = pop.members_loss(first, attr, args)(params, pop.buffers, *args)
        with torch.no_grad():  # a loss that updates buffers (CrossQ's batch-renorm statistics): not an idle member's
            for name, rows in kept.items():
                pop.buffers[name][idle] = rows
        step_members(pop.params, losses, {name: pop.rows[name] for name in trained}, self.stepping, limit,
                     [steps[m].optimizer for m in self.stepping])
        return losses, aux

    def draw(self, draw: Callable[[], T]) -> T:
        drawn = {m: drawn_with(self.torch_rngs, m, draw) for m in self.stepping}
        return stack_members(drawn, len(self.population.algos))  # type: ignore[no-any-return]

    def read(self, read: Callable[[], T]) -> T:
        """`read`, a method of the algorithm (or of an object it holds: its temperature), of every member: stacked
        [members, ...] (each member's networks hold views of its rows, so its own method reads its own weights and
        settings)."""
        held = read_owner(read, self.first)
        owners = [a if held is None else getattr(a, held) for a in self.population.algos]
        with torch.no_grad():
            values = [read.__func__(each) for each in owners]  # type: ignore[attr-defined]
        device = self.population.device
        return torch.stack([torch.as_tensor(v, device=device) for v in values])  # type: ignore[return-value]

    def only(self, members: Callable[[Any], bool]) -> MembersRun | None:
        chosen = [m for m in self.stepping if members(self.population.algos[m])]
        return MembersRun(self.population, chosen, self.storage, self.torch_rngs, self.first) if chosen else None

    def polyak(self, target: nn.Module, source: nn.Module) -> None:
        pop, names = self.population, {id(module): name for name, module in self.first.networks.named_modules()}
        to, of = f"{names[id(target)]}.", f"{names[id(source)]}."
        pairs = [(pop.params[name], pop.params[of + name[len(to):]]) for name in pop.params if name.startswith(to)]
        polyak_members(pairs, [a.tau if m in self.stepping else 0.0 for m, a in enumerate(pop.algos)])

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], -1).mean(1)


def _step_names(algo: Any, step: LossStep) -> set[str]:
    """The names (in the networks) of the weights the LossStep's optimizer trains."""
    trained = {id(p) for p in step.params}
    return {name for name, p in algo.networks.named_parameters() if id(p) in trained}


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
    for algo in algos[1:]:
        other = _plain_settings(algo)
        differ = sorted(k for k in first.keys() | other.keys()
                        if k not in own and k not in COUNTERS and first.get(k) != other.get(k))
        if differ:
            may = ", ".join(sorted(set(own.values())))
            raise ConfigError(f"the members differ in {', '.join(differ)}: {type(algos[0]).__name__} members batch "
                              f"when they differ only in seed, lr, {may}")
