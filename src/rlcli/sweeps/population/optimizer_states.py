"""The members' optimizer state stacked per weight, each member's own state a view of its row (as its parameters
are views of the stacked weights): what the compiled step (compiled.py) and the eager members' Adam, RMSprop or
RAdam step (`StackedStep`) update, and what each member's checkpoint saves.

A load into a member's optimizer (its checkpoint at resume, on_nonfinite=skip's snapshot, a rollback) replaces its
state tensors; `StackedStates.refresh`, which both stacked steps call first, then stacks the states again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from rlcli.algos.compiled import OptimizerRule, optimizer_rule
from rlcli.algos.optim import FusedAdam, RAdam, RMSprop, radam_update, rmsprop_update
from rlcli.registry import ConfigError


def stack_optimizer_states(rules: Sequence[OptimizerRule], rows: dict[str, list[torch.Tensor]],
                           names: list[str]) -> tuple[list[list[torch.Tensor]], torch.Tensor]:
    """The members' optimizer slots (Adam's moments, RMSprop's square average) stacked per weight, each member's
    state now a view of its row (so that its checkpoint saves what a stacked step wrote); and the step counts as
    one [weights, members] tensor, each member's per-weight step tensor a view of its entry (distinct tensors, as
    the optimizers keep them, and where they keep them: RMSprop's (torch's layout) on the CPU, FusedAdam's on the
    parameters' device)."""
    states = {n: [rule.state(p) for rule, p in zip(rules, rows[n], strict=True)] for n in names}
    steps = torch.stack([torch.stack([s["step"] for s in states[n]]) for n in names]).to(torch.float32)
    if not torch.equal(steps, steps[:1].expand_as(steps)):
        raise ConfigError("a population member's weights have taken different numbers of optimizer steps (its "
                          "checkpoint is not one this population wrote)")
    slots: list[list[torch.Tensor]] = [[] for _ in rules[0].slots]
    for i, name in enumerate(names):
        for slot, out in zip(rules[0].slots, slots, strict=True):
            stacked = torch.stack([s[slot] for s in states[name]])
            for row, state in enumerate(states[name]):
                state[slot] = stacked[row]
            out.append(stacked)
        for row, state in enumerate(states[name]):
            state["step"] = steps[i, row]
    return slots, steps


class StackedStates:
    """`stack_optimizer_states` kept current: `refresh()` stacks the states again where a member's optimizer was
    loaded anew since (a load replaces its state tensors, which then are no longer views of the stacked ones: a
    stacked step would go on from the old moments and the member's checkpoints would keep the loaded ones)."""

    def __init__(self, optimizers: Sequence[Any], rows: dict[str, list[torch.Tensor]], names: list[str],
                 rules: Sequence[OptimizerRule] | None = None) -> None:
        """(`rules`: the optimizers' rules where the caller built them already.)"""
        self.optimizers, self.rows, self.names = list(optimizers), rows, names
        self.rules = list(rules) if rules is not None else [optimizer_rule(o) for o in self.optimizers]
        self._stack()

    def _stack(self) -> None:
        self.slots, self.steps = stack_optimizer_states(self.rules, self.rows, self.names)
        self.held = [o.state for o in self.optimizers]

    def refresh(self) -> bool:
        """True: a member's state had been loaded anew, and the states are stacked again."""
        if all(o.state is held for o, held in zip(self.optimizers, self.held, strict=True)):
            return False
        self._stack()
        return True


# Adam's fused kernel: a weight whose per-member size is a multiple of this steps as one stacked tensor: its rows
# then start on the kernel's vector boundaries (8 or 16 floats, unrolled at most 4x), so each row takes the same
# vectorized arithmetic as the member's own call would; a smaller or odd one (PPO's 2-action and value heads'
# biases) steps row by row, as the member's own would round its scalar tail. (RMSprop's and RAdam's elementwise
# operations gave each row's own numbers bit for bit stacked whole, every size from 1 to 259 floats and 2 to 8
# members, here: they step every weight whole.)
WHOLE_ROWS = 64

Setting = tuple[float, ...]  # one param group's settings that must match across members (and pick the call)


def _lr_betas_eps(optimizer: Any) -> list[Setting]:
    return [(g["lr"], *g["betas"], g["eps"]) for g in optimizer.param_groups]


def _lr_alpha_eps(optimizer: Any) -> list[Setting]:
    return [(g["lr"], g["alpha"], g["eps"]) for g in optimizer.param_groups]


def _fused_adam(setting: Setting, params: list[torch.Tensor], grads: list[torch.Tensor],
                slots: list[list[torch.Tensor]], counts: list[torch.Tensor]) -> None:
    """torch's fused kernel, which reads each weight's step count (already advanced)."""
    lr, beta1, beta2, eps = setting
    torch._fused_adam_(params, grads, slots[0], slots[1], [], counts, lr=lr, beta1=beta1, beta2=beta2,
                       weight_decay=0.0, eps=eps, amsgrad=False, maximize=False)


def _rmsprop(setting: Setting, params: list[torch.Tensor], grads: list[torch.Tensor],
             slots: list[list[torch.Tensor]], counts: list[torch.Tensor]) -> None:
    """RMSprop's own update (its step counts are only counted)."""
    rmsprop_update(params, grads, slots[0], *setting)


def _radam(setting: Setting, params: list[torch.Tensor], grads: list[torch.Tensor],
           slots: list[list[torch.Tensor]], counts: list[torch.Tensor]) -> None:
    """RAdam's own update, tensor by tensor, at the members' common step count."""
    step = counts[0].item()  # every member's, every weight's (StackedStep.step checked they are equal)
    for p, grad, exp_avg, exp_avg_sq in zip(params, grads, *slots, strict=True):
        radam_update(p, grad, exp_avg, exp_avg_sq, step, *setting)


class _Kernel(NamedTuple):
    """One optimizer's stacked step: its settings that must match across members, its arithmetic, and the
    per-member size (in floats) whose multiples step stacked whole."""

    optimizer: type
    whole_rows: int
    settings: Callable[[Any], list[Setting]]
    apply: Callable[[Setting, list[torch.Tensor], list[torch.Tensor], list[list[torch.Tensor]],
                     list[torch.Tensor]], None]


_KERNELS = (_Kernel(FusedAdam, WHOLE_ROWS, _lr_betas_eps, _fused_adam),  # PPO's, PG's
            _Kernel(RMSprop, 1, _lr_alpha_eps, _rmsprop),  # A2C's
            _Kernel(RAdam, 1, _lr_betas_eps, _radam))  # PQN's


class StackedStep:
    """The members' optimizer steps as one call (FusedAdam's fused kernel; RMSprop's foreach operations; RAdam's
    operations once per stacked weight), where every member steps with the same settings from the same step count
    (a seed sweep): the stacked weights whole (Adam's where their rows fit the kernel's vectors, WHOLE_ROWS), each
    member's row of the others. `step` returns False, doing nothing, where the members cannot share it, and the
    caller steps each member's own optimizer (on the same stacked state).

    Why: the members' own optimizers step 12 tensors each (a PPO or A2C actor-critic), 48 for 4 members, and the
    kernels and their step counters cost per tensor (Adam: 0.23 ms a step for 4 PPO members), besides handing each
    member its gradient rows first (0.1 ms). The arithmetic is elementwise and each row sees what the member's own
    call would compute, so a member's numbers are its own optimizer's bit for bit, whatever the population's
    size."""

    def __init__(self, params: dict[str, torch.Tensor], rows: dict[str, list[torch.Tensor]],
                 optimizers: Sequence[Any]) -> None:
        self.optimizers = list(optimizers)
        self.kernel = next(k for k in _KERNELS if type(self.optimizers[0]) is k.optimizer)
        self.members = len(self.optimizers)
        # each weight's param group (the same layout in every member: lr_pi / lr_v split the networks alike)
        group_of = {id(p): g for g, group in enumerate(self.optimizers[0].param_groups) for p in group["params"]}
        self.names = [n for n in params if n in rows and id(rows[n][0]) in group_of]
        self.groups = [[i for i, n in enumerate(self.names) if group_of[id(rows[n][0])] == g]
                       for g in range(len(self.optimizers[0].param_groups))]
        self.params = [params[n] for n in self.names]
        self.whole = [p[0].numel() % self.kernel.whole_rows == 0 for p in self.params]
        self.states = StackedStates(self.optimizers, rows, self.names)
        self._restacked()

    @staticmethod
    def fits(optimizers: Sequence[Any]) -> bool:
        """Members of one optimizer it steps (FusedAdam: PPO's, PG's; rlcli's RMSprop: A2C's; rlcli's RAdam:
        PQN's) whose param groups match."""
        kinds = {type(o) for o in optimizers}
        return (len(kinds) == 1 and any(k.optimizer in kinds for k in _KERNELS)
                and len({len(o.param_groups) for o in optimizers}) == 1)

    def _pieces(self, tensors: list[torch.Tensor], indices: list[int]) -> list[torch.Tensor]:
        """The kernel's tensors for these weights: each whole, or its members' rows."""
        out: list[torch.Tensor] = []
        for i in indices:
            out.extend([tensors[i]] if self.whole[i] else tensors[i].unbind())
        return out

    def _restacked(self) -> None:
        steps, slots = self.states.steps, self.states.slots
        counts = [steps[i, 0] if self.whole[i] else steps[i] for i in range(len(self.names))]  # a whole one: any
        self.kernel_args = [(self._pieces(self.params, g), [self._pieces(slot, g) for slot in slots],
                             self._pieces(counts, g)) for g in self.groups]
        self.counts_equal: bool | None = None  # whether every member's step count is the same (None: not read)

    def stepped_apart(self) -> None:
        """Some members stepped their own optimizers (the others idle): their step counts may differ now."""
        self.counts_equal = None

    def step(self, stepping: Sequence[int]) -> bool:
        """One optimizer step of every member at once on the stacked weights' gradients; False where they cannot
        share it (not every member steps, their settings or step counts differ, a gradient is missing)."""
        if self.states.refresh():
            self._restacked()
        if len(stepping) != self.members:
            return False
        settings = self.kernel.settings(self.optimizers[0])
        if any(self.kernel.settings(o) != settings for o in self.optimizers[1:]):
            return False
        maybe_grads = [p.grad for p in self.params]
        grads = [g for g in maybe_grads if g is not None]
        if len(grads) != len(maybe_grads):
            return False
        steps = self.states.steps
        if self.counts_equal is None:
            self.counts_equal = bool(torch.equal(steps, steps[:, :1].expand_as(steps)))
        if not self.counts_equal:
            return False
        calls: dict[Setting, tuple[list[torch.Tensor], list[torch.Tensor], list[list[torch.Tensor]],
                                   list[torch.Tensor]]] = {}  # param groups alike: one call
        for setting, indices, (params, slots, counts) in zip(settings, self.groups, self.kernel_args, strict=True):
            call = calls.setdefault(setting, ([], [], [[] for _ in slots], []))
            call[0].extend(params)
            call[1].extend(self._pieces(grads, indices))
            for into, pieces in zip(call[2], slots, strict=True):
                into.extend(pieces)
            call[3].extend(counts)
        with torch.no_grad():
            steps.add_(1)  # every member's step counters (views of it)
            for setting, (params, grad_pieces, slot_pieces, counts) in calls.items():
                self.kernel.apply(setting, params, grad_pieces, slot_pieces, counts)
        return True
