"""RLCLI_CUDA_GRAPHS=capture: a compiled gradient step replayed as one CUDA graph captured by hand (LeanRL's
recipe). On a GPU a small network's step is launch-bound, and torch.compile's own graphs (mode="reduce-overhead",
the default) still evaluate dynamo's guards and cudagraph trees' bookkeeping at every call (on this CPU the guards
alone were ~0.4 ms of a 1.25 ms compiled SAC critic step with tiny networks). Here, after the first calls, a step is:
copy the new inputs into the graph's own buffers, one replay, copy the outputs the caller keeps. Not yet checked on
a GPU (none was lent when it was written): tests/test_cuda.py holds it to uncaptured steps.

`GraphedStep(function)` runs `function(fixed, moving)`, which must write its results into `fixed` in place (the
parameters, the optimizer's state: tensors whose memory stays where it is) and read `moving` (a batch, noise, learning
rates: a new tensor each call, copied into the graph's buffers). A graph is captured per set of `fixed` addresses,
`moving` shapes, dtypes and non-tensor values and the caller's `context` (a replay runs no Python: every value the
function reads outside its arguments is what it was at the capture), so a changed input is a new capture (kept, at
most MAX_GRAPHS), never a replay over the wrong memory or a stale setting. Capturing runs the function a few
times first (compiling it, and warming cuBLAS on a side stream, as CUDA graphs require), with `fixed` saved before
and put back after, so those calls change nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

MAX_GRAPHS = 8  # captures kept per step (PPO's shorter last minibatch is a second one)
WARMUP_CALLS = 3


class GraphedStep:
    """`step(fixed, moving, context)`: `function(fixed, moving)` replayed from a graph captured for these `fixed`
    addresses, `moving` shapes and values, and `context` (what else the function reads that a replay cannot see:
    the addresses of the other tensors it reads in place, the Python values a schedule moves)."""

    def __init__(self, function: Callable[[list[torch.Tensor], Any], Any]) -> None:
        self.function = function
        self.graphs: dict[Any, tuple[torch.cuda.CUDAGraph, list[Any], Any]] = {}
        self.captures = 0
        self.failed: str | None = None  # why capturing failed (the step then runs uncaptured)

    def __call__(self, fixed: list[torch.Tensor], moving: Any, context: Any = ()) -> Any:
        leaves, spec = tree_flatten(moving)
        if self.failed is not None or not all(x.is_cuda for x in leaves if isinstance(x, torch.Tensor)):
            return self.function(fixed, moving)  # (a host tensor would be baked into the graph as it was)
        addresses = tuple(t.data_ptr() for t in fixed)
        key = (addresses, spec, context,
               tuple((x.shape, x.dtype, x.device) if isinstance(x, torch.Tensor) else x for x in leaves))
        try:
            entry = self.graphs.get(key)
        except TypeError:  # an argument that is neither a tensor nor a plain value: no graph can be keyed on it
            return self.function(fixed, moving)
        with torch.cuda.device(fixed[0].device):  # device=cuda:1: its streams, not the current device's
            if entry is None:
                try:
                    entry = self._capture(fixed, leaves, spec)
                except Exception as error:  # a kernel that cannot be captured: the step runs uncaptured from here on
                    self.failed = f"{type(error).__name__}: {error}"
                    logging.getLogger("rlcli").warning("cuda graphs: the compiled step could not be captured (%s); "
                                                       "it runs without a graph", self.failed)
                    return self.function(fixed, moving)
                for old in [k for k in self.graphs if k[0] != addresses]:  # a reloaded state's: never replayed again
                    del self.graphs[old]
                if len(self.graphs) >= MAX_GRAPHS:
                    self.graphs.pop(next(iter(self.graphs)))
                self.graphs[key] = entry
                self.captures += 1
                if self.captures == 1:
                    logging.getLogger("rlcli").info("cuda graphs: a compiled step is replayed from a graph captured "
                                                    "by hand (RLCLI_CUDA_GRAPHS=capture)")
            graph, buffers, outputs = entry
            tensors = [(b, x) for b, x in zip(buffers, leaves, strict=True) if isinstance(x, torch.Tensor)]
            if tensors:
                torch._foreach_copy_([b for b, _ in tensors], [x for _, x in tensors])
            graph.replay()
        return tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, outputs)

    def _capture(self, fixed: list[torch.Tensor], leaves: list[Any], spec: Any) -> tuple[Any, list[Any], Any]:
        buffers = [x.clone() if isinstance(x, torch.Tensor) else x for x in leaves]
        moving = tree_unflatten(buffers, spec)
        device = fixed[0].device
        saved = [t.clone() for t in fixed]
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        try:
            with torch.cuda.stream(side):
                for _ in range(WARMUP_CALLS):
                    self.function(fixed, moving)
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()  # its own memory pool: graphs of one step may replay in any order
            with torch.cuda.graph(graph, stream=torch.cuda.Stream(device)):
                outputs = self.function(fixed, moving)
        finally:  # the warm-up calls stepped the weights: put them back, once they are done (even after an error)
            torch.cuda.current_stream(device).wait_stream(side)
            torch._foreach_copy_(fixed, saved)
        return graph, buffers, outputs
