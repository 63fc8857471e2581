"""A member's torch RNG stream. Its single run draws actions, minibatch orders and noise from torch's global
generators: the CPU's, and on a GPU the CUDA generator for tensors there. A member keeps its own copy of each
and has it swapped in around its draws, so that on either device it draws what its single run draws."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# torch's CPU generator state, or (that state, every CUDA device's) where the population runs on a GPU
Stream = torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]


def of_member(rng: dict[str, Any]) -> Stream:
    """The torch part of a member's RNG states (checkpoint.rng_state's dict: "cuda" once CUDA is in use)."""
    return (rng["torch"], rng["cuda"]) if "cuda" in rng else rng["torch"]


def keep(rng: dict[str, Any], stream: Stream) -> None:
    """Write an advanced stream back into the member's RNG states."""
    if isinstance(stream, tuple):
        rng["torch"], rng["cuda"] = stream
    else:
        rng["torch"] = stream


def current(like: Stream) -> Stream:
    """The global generators' states now, in the shape of `like` (with CUDA's where `like` has them)."""
    cpu = torch.get_rng_state()
    return (cpu, torch.cuda.get_rng_state_all()) if isinstance(like, tuple) else cpu


def use(stream: Stream) -> None:
    """Make `stream` the global generators' state."""
    if isinstance(stream, tuple):
        torch.set_rng_state(stream[0])
        torch.cuda.set_rng_state_all(stream[1])
    else:
        torch.set_rng_state(stream)


def drawn_with(streams: list[Stream], member: int, draw: Callable[[], Any]) -> Any:
    """`draw()` with the member's stream as the global one; the stream is advanced in `streams`."""
    outer = current(streams[member])
    use(streams[member])
    try:
        return draw()
    finally:
        streams[member] = current(streams[member])
        use(outer)
