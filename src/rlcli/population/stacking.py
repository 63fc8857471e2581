"""Members' weights as one stacked tensor per weight, each member's module keeping a view into it; one member's
code called over all of them at once, and the stacked gradients handed back to the members' own optimizers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, vmap

from rlcli.registry import ConfigError


def stack_weights(modules: Sequence[nn.Module]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Stacked [members, ...] parameters and buffers of same-shaped modules; afterwards each module's tensors are
    views of its row, so its own code (acting, testing, checkpoints, export) reads and writes the shared storage,
    and an in-place step on the stacked tensors updates every member at once."""
    first = modules[0]
    params = {name: _stack(name, [m.get_parameter(name) for m in modules]) for name, _ in first.named_parameters()}
    buffers = {name: _stack(name, [m.get_buffer(name) for m in modules]) for name, _ in first.named_buffers()}
    return params, buffers


def _stack(name: str, tensors: list[torch.Tensor]) -> torch.Tensor:
    shapes = {tuple(t.shape) for t in tensors}
    if len(shapes) != 1:
        raise ConfigError(f"the members' networks differ in the shape of {name} ({sorted(shapes)}): they cannot "
                          "train as one population")
    stacked = torch.stack([t.detach() for t in tensors])
    for row, tensor in enumerate(tensors):
        tensor.data = stacked[row]  # the same Parameter object (optimizers keep it), now a view of the stack
    return stacked


def vmapped(module: nn.Module, prefix: str = "networks") -> Callable[..., Any]:
    """`module`'s forward for every member at once: (stacked params, stacked buffers, *stacked args) -> stacked
    results, each row computed by the module's own code with that member's weights (`functional_call`)."""

    def member(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], *args: Any) -> Any:
        return functional_call(module, {f"{prefix}.{k}": v for k, v in {**params, **buffers}.items()}, args)

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
