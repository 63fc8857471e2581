"""`compile=true` for a population: every member's optimizer step (the vectorized loss, its gradients, each member's
grad-norm clip and optimizer step) as one torch.compile graph; on-policy and value-based members take one per
minibatch or gradient step, the actor-critics two (the critics', then the policy's).

The eager population step spends as much time in autograd's and the optimizer's per-call work as in arithmetic
(PERF notes: 8.4 ms for 8 PPO members against a 5.2 ms hand-written floor). Compiled, the step is a pure function
of the stacked parameters, the stacked optimizer state and the batch, with the single run's optimizer formula
(`algos/compiled.py`'s rule for Adam, A2C's RMSprop or RAdam) applied to every member's rows at once, each with its
own learning rate and step count. The members' own optimizers keep their state: their slot tensors become views of
the stacked ones (as their
parameters are views of the stacked weights), so checkpoints, `rl-eval`, export and resuming one member alone read
what they always read; a member's optimizer loaded anew (its checkpoint at resume, on_nonfinite=skip or
rollback) has its state stacked again before the next step (optimizer_states.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from rlcli.algos.compiled import LazilyCompiled, OptimizerRule, optimizer_rule
from rlcli.registry import ConfigError
from rlcli.sweeps.population.optimizer_states import StackedStates


def one_optimizer_rule(optimizers: Sequence[Any]) -> list[OptimizerRule]:
    """Each member's optimizer's rule, or a one-line ConfigError where the members' optimizers differ in kind or
    settings: the compiled step applies one formula to every member's rows."""
    rules = [optimizer_rule(o) for o in optimizers]
    kinds = {type(o).__name__ for o in optimizers}
    if len(kinds) != 1 or not all(torch.equal(r.hyper, rules[0].hyper) for r in rules):
        raise ConfigError(f"compile=true in a population needs one optimizer with the same settings (betas, eps, "
                          f"alpha) in every member; these members use {', '.join(sorted(kinds))} with different ones")
    return rules


class CompiledMembersStep:
    """`step(batch, active)`: one optimizer step of every active member on its rows of `batch`; returns the
    members' [members] loss statistics. `losses(params, buffers, batch) -> (losses [members], stats)` is
    the members' vectorized loss (lockstep.py's), `params` the stacked weights it reads, `rows`
    each stacked weight's member parameters; those the members' optimizers train are stepped, the rest (a target
    network's) are read as they are."""

    def __init__(self, losses: Callable[..., Any], params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                 rows: dict[str, list[torch.Tensor]], optimizers: Sequence[Any], limit: torch.Tensor | None) -> None:
        rules = one_optimizer_rule(optimizers)
        self.rule: OptimizerRule = rules[0]  # its formula; each member's state is read through its own rule
        self.losses, self.params, self.buffers, self.limit = losses, params, buffers, limit
        self.optimizers = list(optimizers)
        # each weight's param group (the same in every member: lr_pi / lr_v split the networks the same way)
        first = self.optimizers[0]
        group_of = {id(p): i for i, g in enumerate(first.param_groups) for p in g["params"]}
        self.names = [n for n in params if n in rows and id(rows[n][0]) in group_of]
        self.group = [group_of[id(rows[n][0])] for n in self.names]
        self.device = next(iter(params.values())).device
        self.hyper = self.rule.hyper.to(self.device)
        self.states = StackedStates(self.optimizers, rows, self.names, rules)  # stacked again after a member's load
        self._step = LazilyCompiled(self._pure_step)
        self.compile_seconds: float | None = None

    def _pure_step(self, params: dict[str, torch.Tensor], slots: list[list[torch.Tensor]], steps: torch.Tensor,
                   lrs: torch.Tensor, active: torch.Tensor, hyper: torch.Tensor,
                   batch: Any, limit: torch.Tensor | None) -> tuple[Any, ...]:
        trained = {n: params[n] for n in self.names}
        frozen = {n: p for n, p in params.items() if n not in trained}

        def total(weights: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Any]:
            losses, stats = self.losses({**frozen, **weights}, self.buffers, batch)
            return losses.sum(), stats  # the members are independent: each row's gradient is its own loss's

        grads, stats = torch.func.grad(total, has_aux=True)(trained)
        grads_list = [grads[n] for n in self.names]
        members = steps.shape[0]
        if limit is not None:  # clip_grad_norm_'s formula, one norm per member
            norms = torch.stack([torch.linalg.vector_norm(g.reshape(members, -1), dim=1) for g in grads_list])
            scale = torch.clamp(limit / (torch.linalg.vector_norm(norms, dim=0) + 1e-6), max=1.0)
            grads_list = [g * scale.view(-1, *([1] * (g.dim() - 1))) for g in grads_list]
        new_params: list[torch.Tensor] = []
        new_slots: list[list[torch.Tensor]] = [[] for _ in slots]
        for i, (name, g) in enumerate(zip(self.names, grads_list, strict=True)):
            shape = (-1, *([1] * (g.dim() - 1)))  # a member's step count and learning rate over its rows
            on = active.view(shape) > 0
            (p,), stepped = self.rule.apply([params[name]], [g], [[slot[i]] for slot in slots], steps.view(shape),
                                            [lrs[self.group[i]].view(shape)], hyper)
            new_params.append(torch.where(on, p, params[name]))  # a member that has stopped is carried, not stepped
            for k, (slot, (value,)) in enumerate(zip(slots, stepped, strict=True)):
                new_slots[k].append(torch.where(on, value, slot[i]))
        return new_params, new_slots, steps + active, stats

    def step(self, batch: Any, active: torch.Tensor) -> Any:
        """(`batch`: the stacked tensors the loss takes; returns the loss's stats, the
        on-policy members' dict of [members] tensors or the off-policy members' tuple. The members' clips are
        `self.limit` as it is at the call, an input of the graph: a caller whose schedules move them sets it.)"""
        # each member's learning rate per param group, as its schedule set it this update: [groups, members]
        lrs = torch.tensor([[o.param_groups[g]["lr"] for o in self.optimizers]
                            for g in range(len(self.optimizers[0].param_groups))], dtype=torch.float32,
                           device=self.device)
        self.states.refresh()  # a member's optimizer loaded anew since (on_nonfinite=skip, rollback): restacked
        first = self.compile_seconds is None
        started = time.perf_counter()
        with torch.no_grad():
            params = {n: p.detach() for n, p in self.params.items()}
            new_params, new_slots, new_steps, stats = self._step(
                params, self.states.slots, self.states.steps[0].to(self.device, copy=True), lrs, active, self.hyper,
                batch, self.limit)
            torch._foreach_copy_([self.params[n] for n in self.names], new_params)  # the members' views follow
            for old, new in zip(self.states.slots, new_slots, strict=True):
                torch._foreach_copy_(old, new)
            self.states.steps.copy_(new_steps.expand_as(self.states.steps))
            stats = self._step.owned(stats)
        if first:
            self.compile_seconds = time.perf_counter() - started
            logging.getLogger("rlcli").info("compile: the population's first compiled minibatch step took %.1f s",
                                            self.compile_seconds)
        return stats

