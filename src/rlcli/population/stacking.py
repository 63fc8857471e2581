"""Members' weights as one stacked tensor per weight, each member's module keeping a view into it."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

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
