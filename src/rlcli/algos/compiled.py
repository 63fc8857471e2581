"""`compile=true`: a whole minibatch update (loss, gradients, grad-norm clip and Adam) as one compiled graph.

Compiling only the loss gains nothing on small networks: the time goes to autograd's backward, the clip
and the optimizer's Python. So the step is written as a pure function of the parameters, the Adam state
and the batch (`torch.func.grad_and_value` over `functional_call`, torch's Adam formula by hand) and
compiled whole with torch.compile. The parameters and the optimizer's state stay where they are (the
networks, FusedAdam's state): each step reads them and copies the results back, so checkpoints,
resume and the eager path are unchanged.

Inductor's caches go to `$XDG_CACHE_HOME/rlcli/torchinductor` (`~/.cache/...`) unless
TORCHINDUCTOR_CACHE_DIR is set: the second run with the same shapes (another seed, a sweep's next job)
loads the compiled kernels instead of building them again.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn


def cache_dir() -> Path:
    """Where torch.compile's on-disk caches live for rlcli runs (set before the first compile)."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    path = base / "rlcli" / "torchinductor"
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    return path


class _Loss(nn.Module):
    """Holds the networks so that `functional_call` can substitute their parameters."""

    def __init__(self, networks: nn.Module, loss: Callable[..., Any]) -> None:
        super().__init__()
        self.networks = networks
        self._loss = loss

    def forward(self, *args: Any) -> Any:
        return self._loss(*args)


class CompiledAdamStep:
    """One optimizer step of `loss(*args) -> (loss, aux)` over the parameters of `networks` that `optimizer`
    trains (the others, such as a target network's, are read as they are), compiled whole.

    Numerically the same update as zero_grad -> backward -> clip_grad_norm_ -> FusedAdam.step, up to
    floating-point reordering (the test compares runs within a stated tolerance)."""

    def __init__(self, networks: nn.Module, optimizer: Any, loss: Callable[..., Any],
                 max_grad_norm: float | None) -> None:
        from rlcli.algos.optim import FusedAdam
        from rlcli.registry import ConfigError

        if not isinstance(optimizer, FusedAdam):  # the step reads and writes FusedAdam's state layout
            raise ConfigError("compile=true needs torch's fused Adam kernel, which this torch build lacks")
        cache_dir()
        self.module = _Loss(networks, loss)
        self.optimizer = optimizer
        group_of = {id(p): i for i, g in enumerate(optimizer.param_groups) for p in g["params"]}
        trained = [(n, p) for n, p in networks.named_parameters() if id(p) in group_of]
        if len(trained) != len(group_of):
            raise ValueError("compile: the optimizer trains parameters outside the networks")
        self.names = [f"networks.{n}" for n, _ in trained]
        self.params = [p for _, p in trained]
        self.group = [group_of[id(p)] for p in self.params]
        self.max_grad_norm = max_grad_norm
        group0 = optimizer.param_groups[0]  # betas and eps are the same in every group rlcli makes
        self.betas = torch.tensor(group0["betas"], dtype=torch.float32)
        self.eps = torch.tensor(group0["eps"], dtype=torch.float32)
        self._step = torch.compile(self._pure_step, dynamic=False)
        self.compile_seconds: float | None = None  # the first call: tracing and compiling (or loading the cache)

    def _pure_step(self, params: list[torch.Tensor], exp_avg: list[torch.Tensor], exp_avg_sq: list[torch.Tensor],
                   step: torch.Tensor, lrs: torch.Tensor, betas: torch.Tensor, eps: torch.Tensor,
                   args: tuple[Any, ...]) -> tuple[Any, ...]:
        def loss_of(flat: list[torch.Tensor]) -> tuple[torch.Tensor, Any]:
            loss, aux = torch.func.functional_call(self.module, dict(zip(self.names, flat, strict=True)), args,
                                                   strict=False)
            return loss, aux

        grads, (loss, stats) = torch.func.grad_and_value(loss_of, has_aux=True)(params)
        if self.max_grad_norm is not None:  # clip_grad_norm_'s formula
            total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
            coef = torch.clamp(self.max_grad_norm / (total + 1e-6), max=1.0)
            grads = [g * coef for g in grads]
        beta1, beta2 = betas[0], betas[1]
        new_step = step + 1
        bias1 = 1 - beta1 ** new_step
        bias2_sqrt = torch.sqrt(1 - beta2 ** new_step)
        new_params, new_m, new_v = [], [], []
        for i, (p, g, m, v) in enumerate(zip(params, grads, exp_avg, exp_avg_sq, strict=True)):
            m = torch.lerp(m, g, 1 - beta1)
            v = v * beta2 + (1 - beta2) * g * g
            lr = lrs[self.group[i]]
            new_params.append(p - (lr / bias1) * m / (v.sqrt() / bias2_sqrt + eps))
            new_m.append(m)
            new_v.append(v)
        return new_params, new_m, new_v, loss.detach(), stats

    def __call__(self, *args: Any) -> tuple[torch.Tensor, Any]:
        opt = self.optimizer
        states = [opt._state(p) for p in self.params]
        lrs = torch.tensor([g["lr"] for g in opt.param_groups], dtype=torch.float32)  # schedules change them
        step = states[0]["step"]
        first = self.compile_seconds is None
        started = time.perf_counter()
        with torch.no_grad():
            params = [p.detach() for p in self.params]
            new_params, new_m, new_v, loss, stats = self._step(
                params, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states], step, lrs, self.betas,
                self.eps, args)
            torch._foreach_copy_(self.params, new_params)
            torch._foreach_copy_([s["exp_avg"] for s in states], new_m)
            torch._foreach_copy_([s["exp_avg_sq"] for s in states], new_v)
            torch._foreach_add_([s["step"] for s in states], 1)
        if first:
            self.compile_seconds = time.perf_counter() - started
            logging.getLogger("rlcli").info(
                "compile: the first compiled update took %.1f s (tracing, and compiling or loading from the cache %s)",
                self.compile_seconds, cache_dir())
        return loss, stats
