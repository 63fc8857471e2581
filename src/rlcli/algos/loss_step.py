"""One optimizer's step on a loss, eager or compiled: the one place an algorithm's gradient step is written.

Each algorithm builds a `LossStep` per optimizer it steps (PPO: one; SAC: the critics' and the policy's) and
calls it, `step(*args) -> (loss, aux)`. Eagerly that is `loss, aux = loss_fn(*args)`, then zero_grad,
backward, the optional grad-norm clip over the parameters the optimizer trains, and the optimizer's step
(`gradient_step`). `compile=true` turns every LossStep of the algorithm into its `CompiledStep` (algos/compiled.py)
with `enable_compile(algo)`: nothing in an algorithm branches on it.

The loss differentiates only the parameters its optimizer trains: the networks' other trainable parameters (the
critics while the policy steps, a shared body while TRPO fits its value function) are frozen while the loss
is computed, as the compiled step differentiates only those it substitutes.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn

from rlcli.algos.base import gradient_step
from rlcli.algos.compiled import CompiledStep, cuda_graphs_setting


class HasMaxGradNorm(Protocol):
    max_grad_norm: float | None


class LossStep:
    """`loss(*args) -> (loss, aux)` stepped by `optimizer` over the parameters of `networks` it trains.

    `clip_of`: what holds `max_grad_norm`, read at every step (the algorithm: a schedule moves it); None: no clip.
    `updates_buffers`: the loss updates buffers in place (CrossQ's batch renorm), which the compiled
    step takes as inputs. Compiled, a number argument (or a number in a tuple or list argument) goes in as a
    0-dim tensor on the parameters' device, so that a new value is not a new graph; eagerly every argument goes in as
    it is (Python floats stay floats: the eager arithmetic is the one the algorithm wrote)."""

    def __init__(self, networks: nn.Module, optimizer: Any, loss: Any, clip_of: HasMaxGradNorm | None = None,
                 updates_buffers: bool = False) -> None:
        trained = {id(p) for group in optimizer.param_groups for p in group["params"]}
        self.networks, self.optimizer, self.loss = networks, optimizer, loss
        self.params = [p for p in networks.parameters() if id(p) in trained]  # the networks' order: clip's sum
        if len(self.params) != len(trained):
            raise ValueError("LossStep: the optimizer trains parameters outside the networks")
        self.others = [p for p in networks.parameters() if id(p) not in trained and p.requires_grad]
        self.clip_of, self.updates_buffers = clip_of, updates_buffers
        self.compiled: CompiledStep | None = None
        self._numbers: dict[tuple[str, str], torch.Tensor] = {}  # as_input's tensors by position and value

    @property
    def max_grad_norm(self) -> float | None:
        return None if self.clip_of is None else self.clip_of.max_grad_norm

    @property
    def compile_seconds(self) -> float | None:
        """The compiled step's first call (tracing, and compiling or loading the cache); None before, or eager."""
        return None if self.compiled is None else self.compiled.compile_seconds

    def compile(self) -> None:
        self.compiled = CompiledStep(self.networks, self.optimizer, self.loss, self.updates_buffers)

    def __call__(self, *args: Any) -> tuple[torch.Tensor, Any]:
        if self.compiled is not None:
            device = self.compiled.device
            numbers = self._numbers
            return self.compiled(as_input(self.max_grad_norm, device, numbers, "clip"),
                                 *(as_input(a, device, numbers, str(i)) for i, a in enumerate(args)))
        frozen = [p for p in self.others if p.requires_grad]
        for p in frozen:
            p.requires_grad_(False)
        try:
            loss, aux = self.loss(*args)
        finally:
            for p in frozen:
                p.requires_grad_(True)
        gradient_step(self.optimizer, loss, self.params, self.max_grad_norm)
        return loss, aux


def as_input(value: Any, device: torch.device, made: dict[tuple[str, str], torch.Tensor] | None = None,
             slot: str = "") -> Any:
    """A compiled step's argument: a number as a 0-dim float32 tensor on `device` (a tuple's or list's too). `made`
    keeps the tensors by argument position (`slot`) and value, so that a number that did not change is not copied to
    a GPU again (each such copy waits for the GPU's queue); the step only reads them. By position too: two arguments
    of equal value (PPO's vf_coef and max_grad_norm, both 0.5) as one tensor would be an aliasing dynamo guards on,
    and a schedule pulling them apart would compile a second graph."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if made is None:
            return torch.tensor(float(value), device=device)
        key = (slot, float(value).hex())  # -0.0 is not 0.0
        tensor = made.get(key)
        if tensor is None:
            if len(made) >= 64:  # a schedule's values: keep the last ones only
                made.clear()
            tensor = made[key] = torch.tensor(float(value), device=device)
        return tensor
    if type(value) in (tuple, list):
        return type(value)(as_input(v, device, made, f"{slot}.{i}") for i, v in enumerate(value))
    return value


def sub_algorithms(algo: Any) -> list[Any]:
    """The algorithm and those it is made of, all the way down (`sub_algorithms`: algo.groups' algorithm of each
    group)."""
    parts = algo.sub_algorithms() if callable(getattr(algo, "sub_algorithms", None)) else []
    return [algo, *(inner for part in parts for inner in sub_algorithms(part))]


def loss_steps(algo: Any) -> list[LossStep]:
    """The LossSteps of the algorithm and of those it is made of: their attributes that are one."""
    return [value for part in sub_algorithms(algo) for value in vars(part).values() if isinstance(value, LossStep)]


def enable_compile(algo: Any) -> None:
    """compile=true: compile every LossStep of the algorithm, or a one-line ConfigError naming what the compiled
    step does not cover (the algorithm's `compile_refusal()`, e.g. a recurrent actor)."""
    from rlcli.registry import ConfigError

    cuda_graphs_setting()  # a bad RLCLI_CUDA_GRAPHS is one line now, not a traceback at the first update
    for part in sub_algorithms(algo):
        refusal = getattr(part, "compile_refusal", None)
        reason = refusal() if refusal is not None else None
        if reason is not None:
            raise ConfigError(reason)
    steps = loss_steps(algo)
    if not steps:  # (a plugin written before LossStep)
        raise ConfigError(f"compile=true: {type(algo).__name__} steps no optimizer through a LossStep "
                          "(rlcli/algos/loss_step.py), so there is nothing to compile; drop compile=true")
    for step in steps:
        step.compile()


def compile_enabled(algo: Any) -> bool:
    """Whether `enable_compile` compiled the algorithm's steps."""
    return any(step.compiled is not None for step in loss_steps(algo))
