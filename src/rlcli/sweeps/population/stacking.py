"""Members' weights as one stacked tensor per weight, each member's module keeping a view into it; one member's
code called over all of them at once, and the stacked gradients handed back to the members' own optimizers."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.func import functional_call, vmap

from rlcli.registry import ConfigError

if TYPE_CHECKING:
    from rlcli.sweeps.population.optimizer_states import StackedStep


def stack_weights(modules: Sequence[nn.Module]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Stacked [members, ...] parameters and buffers of same-shaped modules; afterwards each module's tensors are
    views of its row, so its own code (acting, testing, checkpoints, export) reads and writes the shared storage,
    and an in-place step on the stacked tensors updates every member at once."""
    first = modules[0]
    _refuse_shared_weights(first)
    names = {name for name, _ in [*first.named_parameters(), *first.named_buffers()]}
    for module in modules[1:]:
        differ = names ^ {name for name, _ in [*module.named_parameters(), *module.named_buffers()]}
        if differ:
            named = ", ".join(sorted(differ)[:3]) + (", ..." if len(differ) > 3 else "")
            raise ConfigError(f"the members' networks differ in which weights they have ({named}): they cannot train "
                              "as one population")
    params = {name: _stack(name, [m.get_parameter(name) for m in modules]) for name, _ in first.named_parameters()}
    buffers = {name: _stack(name, [m.get_buffer(name) for m in modules]) for name, _ in first.named_buffers()}
    return params, buffers


def _refuse_shared_weights(module: nn.Module) -> None:
    """One weight held by two different modules (tied weights) cannot be swapped per member once (see vmapped);
    one module under two names (a shared body) can."""
    holders: dict[int, tuple[str, set[int]]] = {}
    named = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
    for name, tensor in named:
        owner = module.get_submodule(name.rpartition(".")[0])
        first, owners = holders.setdefault(id(tensor), (name, set()))
        owners.add(id(owner))
        if len(owners) > 1:
            raise ConfigError(f"the network ties {first} and {name} (one weight in two modules): it cannot train in a "
                              "population; one module shared under two names can")


def _stack(name: str, tensors: list[torch.Tensor]) -> torch.Tensor:
    shapes = {tuple(t.shape) for t in tensors}
    if len(shapes) != 1:
        raise ConfigError(f"the members' networks differ in the shape of {name} ({sorted(shapes)}): they cannot "
                          "train as one population")
    stacked = torch.stack([t.detach() for t in tensors])
    for row, tensor in enumerate(tensors):
        tensor.data = stacked[row]  # the same Parameter object (optimizers keep it), now a view of the stack
    return stacked


def vmapped(module: nn.Module) -> Callable[..., Any]:
    """`module`'s forward for every member at once: (stacked params, stacked buffers, *stacked args) -> stacked
    results, each row computed by the module's own code with that member's weights (`functional_call`)."""

    def member(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], *args: Any) -> Any:
        # tie_weights=False: a module reached under two names (actor.shared=true's one body for policy and value)
        # is swapped once, on the object both names hold; torch's tie handling swapped it under each name and
        # left the batched weights in it. (Weights shared by two different modules are refused by stack_weights.)
        return functional_call(module, {f"networks.{k}": v for k, v in {**params, **buffers}.items()}, args,
                               tie_weights=False)

    return vmap(member)


def clip_limits(max_norms: Sequence[float | None], device: torch.device | str = "cpu") -> torch.Tensor | None:
    """The members' gradient-norm clips as one [members] tensor (inf for a member without one), or None when no
    member clips."""
    if all(m is None for m in max_norms):
        return None
    return torch.tensor([float("inf") if m is None else m for m in max_norms], device=device)


def hand_gradients(params: dict[str, torch.Tensor], rows: dict[str, list[torch.Tensor]],
                   members: Sequence[int]) -> None:
    """Give each of `members` its row of the stacked gradients, so that its own optimizer can step it."""
    for name, member_params in rows.items():
        grad = params[name].grad
        if grad is None:  # not trained by this loss (a target network, the other half of an actor-critic)
            continue
        for m in members:
            member_params[m].grad = grad[m]


def members_mask(stepping: Collection[int], members: int, device: torch.device | str) -> torch.Tensor:
    """[members] 1.0 for the stepping members, 0.0 for the others (what a compiled step steps)."""
    return torch.tensor([float(m in stepping) for m in range(members)], device=device)


def stack_members(values: dict[int, Any], members: int) -> Any:
    """The stepping members' values (tensors, or tuples and lists of them and of Nones) stacked over all `members`;
    an idle member's rows repeat the first stepping member's (computed with the idle member's weights, never
    stepped)."""
    filler = next(iter(values.values()))
    return _stack_rows([values.get(m, filler) for m in range(members)])


def _stack_rows(rows: list[Any]) -> Any:
    first = rows[0]
    if first is None:
        return None
    if isinstance(first, torch.Tensor):
        return torch.stack(rows)
    stacked = [_stack_rows([row[i] for row in rows]) for i in range(len(first))]
    return stacked if isinstance(first, list) else tuple(stacked)


def clip_members(params: dict[str, torch.Tensor], limit: torch.Tensor) -> None:
    """Each member's global gradient-norm clip to its `limit` row (torch's clip_grad_norm_ formula, one norm per
    member over the stacked `params`' gradients; inf for a member without a clip)."""
    grads = [p.grad for p in params.values() if p.grad is not None]
    norms = torch.stack([torch.linalg.vector_norm(g.reshape(g.shape[0], -1), dim=1) for g in grads])
    total = torch.linalg.vector_norm(norms, dim=0)
    scale = torch.clamp(limit / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(scale.view(-1, *([1] * (g.dim() - 1))))


def step_members(params: dict[str, torch.Tensor], losses: torch.Tensor, rows: dict[str, list[torch.Tensor]],
                 stepping: Sequence[int], limit: torch.Tensor | None, optimizers: Sequence[Any],
                 stacked_step: StackedStep | None = None) -> None:
    """A single run's `gradient_step` for every stepping member at once: backward through all members' losses
    (independent, so each row's gradient is its own loss's), each member's clip over the gradients of `rows` (the
    part this optimizer trains), then one optimizer step over the stacked weights (`stacked_step`, where the members
    can share it) or the members' own optimizers."""
    for stacked in params.values():
        stacked.grad = None
    torch.autograd.backward(losses.sum())
    if limit is not None:
        clip_members({name: params[name] for name in rows}, limit)
    if stacked_step is not None and stacked_step.step(stepping):
        return
    hand_gradients(params, rows, stepping)
    for optimizer in optimizers:
        optimizer.step()
    if stacked_step is not None:
        stacked_step.stepped_apart()


@torch.no_grad()
def polyak_members(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], taus: Sequence[float]) -> None:
    """Each member's Polyak update of its (stacked target, stacked source) rows with its own tau; a tau of 0 leaves
    the member's target as it is (lerp's formula returns it unchanged), 1 copies."""
    if not any(taus) or not pairs:
        return
    weights = torch.tensor(list(taus), device=pairs[0][0].device)
    for target, source in pairs:
        target.lerp_(source, weights.view(-1, *([1] * (target.dim() - 1))))
