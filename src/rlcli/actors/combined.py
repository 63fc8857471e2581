"""`actor=combined`: networks for Dict observations that hold images and vectors (SB3's MultiInputPolicy with
its CombinedExtractor): a convolutional encoder per image key, the other keys flattened, all concatenated,
then the usual hidden layers and heads (on-policy actor-critic, or a recipe for off-policy algorithms).

The observations arrive packed (envs/dict_obs.py: one uint8 vector per step); the encoder unpacks each
key with the layout its observation space carries, on the training device.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import gymnasium as gym
import torch
from torch import nn

from rlcli.actors.cnn import NATURE_CONVS, ConvEncoder, check_conv_settings
from rlcli.actors.layers import Activation, orthogonal_init
from rlcli.actors.mlp import ActorCritic
from rlcli.actors.normalizer import RunningNorm
from rlcli.actors.offpolicy import NetworkRecipe
from rlcli.actors.per_agent import refuse_separate
from rlcli.actors.sde import SdeOptions
from rlcli.contracts import NetworkSpec
from rlcli.envs.dict_obs import PackedDict
from rlcli.registry import ACTORS, ConfigError

_TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64, "int32": torch.int32,
                 "uint8": torch.uint8, "int8": torch.int8, "float16": torch.float16, "bool": torch.bool}


class CombinedEncoder(nn.Module):
    """packed uint8 [B, bytes] -> each image key through its own ConvEncoder, each other key as float, flattened
    -> concatenated [B, out_features]."""

    def __init__(self, space: PackedDict, convs: list[list[int]], image_features: int, pixel_scale: float,
                 activation: Activation) -> None:
        super().__init__()
        self.entries = space.entries
        self.images = nn.ModuleDict({e.key: ConvEncoder(e.shape, convs, image_features, pixel_scale, activation)
                                     for e in self.entries if e.image})
        for e in self.entries:
            if not e.image and str(e.dtype) not in _TORCH_DTYPES:
                raise ConfigError(f"actor=combined cannot read Dict entry {e.key!r} of dtype {e.dtype}")
        self.out_features = sum(image_features if e.image else math.prod(e.shape) for e in self.entries)

    def forward(self, packed: torch.Tensor) -> torch.Tensor:
        batch = packed.shape[:-1]
        flat = packed.reshape(-1, packed.shape[-1])
        parts = []
        for e in self.entries:
            raw = flat[:, e.offset:e.offset + e.nbytes]
            if e.image:
                parts.append(self.images[e.key](raw.reshape(-1, *e.shape)))
            else:  # the key's own bits, back in its dtype
                parts.append(raw.contiguous().view(_TORCH_DTYPES[str(e.dtype)]).float())
        return torch.cat(parts, -1).reshape(*batch, self.out_features)


@ACTORS.register("combined", spec=NetworkSpec(image=True, sde=True))
def build_combined_actor(
    observation_space: gym.spaces.Space,
    action_space: gym.spaces.Space,
    normalize_obs: bool = False,
    clip_obs: float = 10.0,
    heads: Literal["actor_critic", "recipe"] = "actor_critic",
    convs: list[list[int]] = NATURE_CONVS,  # type: ignore[assignment]
    image_features: int = 256,
    hidden_sizes: list[int] = (64, 64),  # type: ignore[assignment]
    activation: Activation = "relu",
    shared: bool = False,
    ortho_init: bool = True,
    log_std_init: float | None = None,
    full_std: bool = True,
    use_expln: bool = False,
    pixel_scale: float = 255.0,
    use_sde: bool = False,
) -> ActorCritic | Any:
    """An actor-critic (or an off-policy recipe) over a CombinedEncoder of the Dict observation's keys."""
    if not isinstance(observation_space, PackedDict):
        raise ConfigError(f"actor=combined is for Dict observations that hold images; the env's observations are "
                          f"{observation_space}: use actor=mlp (vectors) or actor=cnn (images)")
    refuse_separate(observation_space, "combined")
    if normalize_obs:
        raise ConfigError("env.normalize_obs=true does not apply to actor=combined yet (its images are scaled by "
                          "actor.pixel_scale); set env.normalize_obs=false")
    check_conv_settings(convs, "actor.image_features", image_features, hidden_sizes, pixel_scale)
    layers = [list(map(int, c)) for c in convs]

    def make_encoder() -> CombinedEncoder:
        encoder = CombinedEncoder(observation_space, layers, image_features, pixel_scale, activation)
        if ortho_init:
            orthogonal_init(encoder, math.sqrt(2))
        return encoder

    width = make_encoder().out_features  # fails here, in one line, if the convolutions do not fit an image
    normalizer = RunningNorm(tuple(observation_space.shape), clip=clip_obs, enabled=False)
    sde = SdeOptions(full_std, use_expln)
    if heads == "recipe":

        def encoder() -> tuple[nn.Module, int]:
            return make_encoder(), width

        return NetworkRecipe(width, list(hidden_sizes), activation, ortho_init, normalizer, encoder=encoder,
                             uint8_input=True, log_std_init=log_std_init, sde=sde)
    return ActorCritic(observation_space, action_space, list(hidden_sizes), activation, shared, ortho_init,
                       0.0 if log_std_init is None else log_std_init, normalize_obs=False, clip_obs=clip_obs,
                       encoder=make_encoder(), sde=sde if use_sde else None)
