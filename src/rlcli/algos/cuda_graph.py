"""RLCLI_CUDA_GRAPHS=capture: a compiled gradient step replayed as one CUDA graph captured by hand (LeanRL's
recipe). On a GPU a small network's step is launch-bound, and torch.compile's own graphs (mode="reduce-overhead",
the default) still evaluate dynamo's guards and cudagraph trees' bookkeeping at every call (on this CPU the guards
alone were ~0.4 ms of a 1.25 ms compiled SAC critic step with tiny networks). Here, after the first calls, a step is:
copy the new inputs into the graph's own buffers, one replay, copy the outputs the caller keeps. Not yet checked on
a GPU (none was lent when it was written): tests/test_cuda.py holds it to uncaptured steps.

`GraphedStep(function)` runs `function(fixed, moving)`, which must write its results into `fixed` in place (the
parameters, the optimizer's state: tensors whose memory stays where it is) and read `moving` (a batch, noise, learning
rates: a new tensor each call, copied into the graph's buffers). A graph is captured per set of `fixed` addresses and
`moving` shapes, dtypes and non-tensor values, so a changed input is a new capture (kept, at most MAX_GRAPHS), never
a replay over the wrong memory. Capturing runs the function a few times first (compiling it, and warming cuBLAS on a
side stream, as CUDA graphs require), with `fixed` saved before and put back after, so those calls change nothing.
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
    def __init__(self, function: Callable[[list[torch.Tensor], Any], Any]) -> None:
        self.function = function
        self.graphs: dict[Any, tuple[torch.cuda.CUDAGraph, list[Any], Any]] = {}
        self.failed: str | None = None  # why capturing failed (the step then runs uncaptured)

    def __call__(self, fixed: list[torch.Tensor], moving: Any) -> Any:
        if self.failed is not None:
            return self.function(fixed, moving)
        leaves, spec = tree_flatten(moving)
        key = (tuple(t.data_ptr() for t in fixed), spec,
               tuple((x.shape, x.dtype, x.device) if isinstance(x, torch.Tensor) else x for x in leaves))
        try:
            entry = self.graphs.get(key)
        except TypeError:  # an argument that is neither a tensor nor a plain value: no graph can be keyed on it
            return self.function(fixed, moving)
        if entry is None:
            try:
                entry = self._capture(fixed, leaves, spec)
            except Exception as error:  # a kernel that cannot be captured: the step runs uncaptured from here on
                self.failed = f"{type(error).__name__}: {error}"
                logging.getLogger("rlcli").warning("cuda graphs: the compiled step could not be captured (%s); it "
                                                   "runs without a graph", self.failed)
                return self.function(fixed, moving)
            if len(self.graphs) >= MAX_GRAPHS:
                self.graphs.pop(next(iter(self.graphs)))
            self.graphs[key] = entry
        graph, buffers, outputs = entry
        tensors = [(b, x) for b, x in zip(buffers, leaves, strict=True) if isinstance(x, torch.Tensor)]
        if tensors:
            torch._foreach_copy_([b for b, _ in tensors], [x for _, x in tensors])
        graph.replay()
        return tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, outputs)

    def _capture(self, fixed: list[torch.Tensor], leaves: list[Any], spec: Any) -> tuple[Any, list[Any], Any]:
        buffers = [x.clone() if isinstance(x, torch.Tensor) else x for x in leaves]
        moving = tree_unflatten(buffers, spec)
        saved = [t.clone() for t in fixed]
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(WARMUP_CALLS):
                    self.function(fixed, moving)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()  # its own memory pool: graphs of one step may replay in any order
            with torch.cuda.graph(graph):
                outputs = self.function(fixed, moving)
        finally:  # the warm-up calls stepped the weights: put them back
            torch._foreach_copy_(fixed, saved)
        return graph, buffers, outputs
