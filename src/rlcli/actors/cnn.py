"""Convolutional actors for image observations (`actor=cnn`): the Nature-DQN extractor by default.

Pixels stay uint8 from the env through the rollout and replay buffers (a quarter of float32's
memory) and are converted to float and scaled by 1/`pixel_scale` inside the network, on the
training device. Images may be channels-first [C, H, W] (gymnasium's Atari preprocessing with frame
stacking, PixelGoal-v0) or channels-last [H, W, C]; the smallest of the first and last dimensions
is taken as the channels, as SB3 does.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlcli.actors.layers import _ACTIVATIONS, Activation, orthogonal_init
from rlcli.actors.mlp import ActorCritic
from rlcli.actors.normalizer import RunningNorm
from rlcli.actors.offpolicy import NetworkRecipe
from rlcli.actors.per_agent import refuse_separate
from rlcli.actors.sde import SdeOptions
from rlcli.contracts import NetworkSpec
from rlcli.envs.dict_obs import PackedDict
from rlcli.registry import ACTORS, ConfigError, require

NATURE_CONVS = [[32, 8, 4], [64, 4, 2], [64, 3, 1]]  # [out_channels, kernel, stride], Mnih et al. 2015


class ConvEncoder(nn.Module):
    """uint8 image -> float / pixel_scale -> conv layers -> flatten -> linear(features) -> activation."""

    def __init__(self, obs_shape: tuple[int, ...], convs: list[list[int]], features: int, pixel_scale: float,
                 activation: Activation) -> None:
        super().__init__()
        self.channels_last = obs_shape[-1] < obs_shape[0]
        channels, height, width = ((obs_shape[2], obs_shape[0], obs_shape[1]) if self.channels_last
                                   else tuple(obs_shape))
        layers: list[nn.Module] = []
        for out_channels, kernel, stride in convs:
            layers += [nn.Conv2d(channels, out_channels, kernel, stride), _ACTIVATIONS[activation]()]
            channels = out_channels
        self.convs = nn.Sequential(*layers, nn.Flatten())
        with torch.no_grad():
            try:
                flat = self.convs(torch.zeros(1, obs_shape[2] if self.channels_last else obs_shape[0],
                                              height, width)).shape[1]
            except RuntimeError:
                flat = 0
        if flat == 0:
            raise ConfigError(f"actor.convs={convs} shrink the {height}x{width} observation to nothing; use smaller "
                              "kernels or strides (e.g. actor.convs=[[16,3,1],[32,3,1]] for small images)")
        self.linear = nn.Sequential(nn.Linear(flat, features), _ACTIVATIONS[activation]())
        self.pixel_scale = pixel_scale
        self.out_features = features

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.float() / self.pixel_scale
        if self.channels_last:
            x = x.movedim(-1, -3)
        return self.linear(self.convs(x))


def check_image_space(space: gym.spaces.Space, normalize_obs: bool) -> None:
    if isinstance(space, PackedDict):
        raise ConfigError("the env's Dict observations hold images and other entries: use actor=combined, not "
                          "actor=cnn")
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 3:
        raise ConfigError(f"actor=cnn needs image observations (a Box of shape [C, H, W] or [H, W, C]); the env's "
                          f"observations are {space}: use actor=mlp")
    if normalize_obs:
        raise ConfigError("env.normalize_obs=true does not apply to actor=cnn: pixels are scaled by "
                          "actor.pixel_scale inside the network; set env.normalize_obs=false")


def check_conv_settings(convs: list[list[int]], features_key: str, features: int, hidden_sizes: list[int],
                        pixel_scale: float) -> None:
    """One line naming the bad convolution, feature or hidden size (actor=cnn and actor=combined alike)."""
    require(all(len(c) == 3 and all(int(v) > 0 for v in c) for c in convs), "actor.convs", convs,
            "each layer is [out_channels, kernel, stride], all > 0")
    require(features > 0, features_key, features, "must be > 0")
    require(all(h > 0 for h in hidden_sizes), "actor.hidden_sizes", list(hidden_sizes), "sizes must be > 0")
    require(pixel_scale > 0, "actor.pixel_scale", pixel_scale, "must be > 0")


@ACTORS.register("cnn", spec=NetworkSpec(image=True, sde=True))
def build_cnn_actor(
    observation_space: gym.spaces.Space,
    action_space: gym.spaces.Space,
    normalize_obs: bool = False,
    clip_obs: float = 10.0,
    heads: Literal["actor_critic", "recipe"] = "actor_critic",
    convs: list[list[int]] = NATURE_CONVS,  # type: ignore[assignment]
    features: int = 512,
    hidden_sizes: list[int] = (),  # type: ignore[assignment]
    activation: Activation = "relu",
    shared: bool = True,
    ortho_init: bool = True,
    log_std_init: float | None = None,
    full_std: bool = True,
    use_expln: bool = False,
    pixel_scale: float = 255.0,
    use_sde: bool = False,
) -> ActorCritic | Any:
    """An actor-critic on a shared convolutional encoder, or a NetworkRecipe whose networks each get one.
    `log_std_init`, `full_std`, `use_expln` and `use_sde` (from algo.use_sde) as for actor=mlp."""
    refuse_separate(observation_space, "cnn")
    check_image_space(observation_space, normalize_obs)
    check_conv_settings(convs, "actor.features", features, hidden_sizes, pixel_scale)
    obs_shape = tuple(observation_space.shape)
    uint8_input = observation_space.dtype == np.uint8

    def make_encoder() -> ConvEncoder:
        encoder = ConvEncoder(obs_shape, [list(map(int, c)) for c in convs], features, pixel_scale, activation)
        if ortho_init:
            orthogonal_init(encoder, math.sqrt(2))
        return encoder

    make_encoder()  # fail here, in one line, if the convolutions do not fit the image
    normalizer = RunningNorm(obs_shape, clip=clip_obs, enabled=False)
    if heads == "recipe":

        def encoder() -> tuple[nn.Module, int]:
            return make_encoder(), features

        return NetworkRecipe(features, list(hidden_sizes), activation, ortho_init, normalizer, encoder=encoder,
                             uint8_input=uint8_input, log_std_init=log_std_init, sde=SdeOptions(full_std, use_expln))
    actor = ActorCritic(observation_space, action_space, list(hidden_sizes), activation, shared, ortho_init,
                        0.0 if log_std_init is None else log_std_init, normalize_obs=False, clip_obs=clip_obs,
                        encoder=make_encoder(), sde=SdeOptions(full_std, use_expln) if use_sde else None)
    return actor
