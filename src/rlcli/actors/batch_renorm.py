"""Batch Renormalization (Ioffe 2017), the normalization CrossQ's networks are built with.

In training mode a batch is normalized with its own statistics for the first `warmup_steps`
forward passes (plain BatchNorm), afterwards with the running statistics, corrected toward the
batch's by the clipped factors r (scale, within [1/r_max, r_max]) and d (shift, within
[-d_max, d_max]) that carry no gradient; the running statistics move toward every training batch.
In eval mode the running statistics normalize and nothing is updated. The running statistics and
the step count are buffers, so they are saved with the networks.
"""

from __future__ import annotations

import torch
from torch import nn

from rlcli.actors.layers import _ACTIVATIONS, Activation


class BatchRenorm(nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-3, momentum: float = 0.01, warmup_steps: int = 100_000,
                 r_max: float = 3.0, d_max: float = 5.0) -> None:
        super().__init__()
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.register_buffer("steps", torch.tensor(0, dtype=torch.long))
        self.scale = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.eps, self.momentum, self.warmup_steps = eps, momentum, warmup_steps
        self.r_max, self.d_max = r_max, d_max

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        running_mean, running_var = self.running_mean, self.running_var
        if not self.training:
            mean, var = running_mean, running_var
        else:
            # unbiased variance as x.var(0), written out: torch's strided var kernel is ~8x slower on a CPU
            batch_mean = x.mean(0)
            batch_var = (x - batch_mean).square().sum(0) / (x.shape[0] - 1)
            mean, var = batch_mean, batch_var
            renorm = self.steps > self.warmup_steps
            if torch.compiler.is_compiling() or torch._C._functorch.is_functorch_wrapped_tensor(x):
                # a graph (or vmap over a population's members, each at its own step) has no data-dependent branch:
                # during the warm-up r = 1 and d = 0 leave the batch statistics exactly as they are
                # (x - 0 * s / 1 = x); the square root sees 1 then, so that a dead unit's zero variance does not put
                # 0 * inf into its gradient
                r, d = self._corrections(batch_mean, batch_var)
                r, d = torch.where(renorm, r, 1.0), torch.where(renorm, d, 0.0)
                mean, var = batch_mean - d * torch.where(renorm, batch_var, 1.0).sqrt() / r, batch_var / r.square()
            elif renorm:  # eager: no renormalization work during the warm-up
                r, d = self._corrections(batch_mean, batch_var)
                mean, var = batch_mean - d * batch_var.sqrt() / r, batch_var / r.square()
            with torch.no_grad():
                running_mean += self.momentum * (batch_mean.detach() - running_mean)
                running_var += self.momentum * (batch_var.detach() - running_var)
                self.steps += 1
        return self.scale * (x - mean) / (var + self.eps).sqrt() + self.bias

    def _corrections(self, batch_mean: torch.Tensor, batch_var: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch Renormalization's r (the std ratio) and d (the mean shift), clipped and not differentiated."""
        running_std = (self.running_var + self.eps).sqrt()
        r = ((batch_var + self.eps).sqrt() / running_std).detach().clamp(1 / self.r_max, self.r_max)
        d = ((batch_mean - self.running_mean) / running_std).detach().clamp(-self.d_max, self.d_max)
        return r, d

    def extra_repr(self) -> str:
        return f"{self.scale.numel()}, momentum={self.momentum}, warmup_steps={self.warmup_steps}"


def renorm_mlp(in_features: int, hidden_sizes: list[int], out_features: int, activation: Activation,
               **renorm: float) -> nn.Sequential:
    """CrossQ's network: [BatchRenorm -> Linear -> activation] per hidden layer, then BatchRenorm ->
    Linear(out_features). Every linear layer sees normalized inputs, the observation included."""
    layers: list[nn.Module] = []
    width = in_features
    for size in hidden_sizes:
        layers += [BatchRenorm(width, **renorm), nn.Linear(width, size), _ACTIVATIONS[activation]()]  # type: ignore[arg-type]
        width = size
    layers += [BatchRenorm(width, **renorm), nn.Linear(width, out_features)]  # type: ignore[arg-type]
    return nn.Sequential(*layers)
