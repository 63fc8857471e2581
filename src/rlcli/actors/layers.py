"""Building blocks every network recipe shares: MLP stacks, activations, orthogonal init."""

from __future__ import annotations

from typing import Literal

from torch import nn

Activation = Literal["tanh", "relu", "elu", "gelu", "silu", "leaky_relu"]
_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "gelu": nn.GELU, "silu": nn.SiLU, "leaky_relu": nn.LeakyReLU,
}


def mlp(in_features: int, hidden_sizes: list[int], activation: Activation) -> nn.Sequential:
    layers: list[nn.Module] = []
    for size in hidden_sizes:
        layers += [nn.Linear(in_features, size), _ACTIVATIONS[activation]()]
        in_features = size
    return nn.Sequential(*layers)


def orthogonal_init(module: nn.Module, gain: float) -> None:
    for layer in module.modules():
        if isinstance(layer, (nn.Linear, nn.Conv2d)):
            nn.init.orthogonal_(layer.weight, gain)
            nn.init.zeros_(layer.bias)
