"""Dict observations that hold images (an image and a vector together, SB3's MultiInputPolicy case).

Every part of rlcli moves one observation tensor per step (collector, rollout and replay storage,
checkpoints, Ray). A Dict observation with an image key therefore travels *packed*: each key's array
as its raw bytes, side by side, in one uint8 vector. Images stay uint8 (a quarter of float32's memory),
float entries keep their exact bits, and nothing between the env and the network needs to know; the
network (`actor=combined`, actors/combined.py) unpacks it with the layout the observation space carries.
Dicts without images are flattened to one float vector instead, as before (goal envs and HER read that).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import VectorEnv

from rlcli.registry import ConfigError


@dataclass(frozen=True)
class Entry:
    key: str
    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int  # first byte in the packed vector
    image: bool

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize


def is_image(space: gym.spaces.Space) -> bool:
    """A uint8 Box of three dimensions, channels first or last (SB3's is_image_space)."""
    return isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3


def has_images(space: gym.spaces.Space) -> bool:
    return isinstance(space, gym.spaces.Dict) and any(is_image(s) for s in space.spaces.values())


class PackedDict(gym.spaces.Box):
    """The packed observations' space: a uint8 Box of `size` bytes that remembers the Dict it packs."""

    def __init__(self, dict_space: gym.spaces.Dict, env_id: str = "the env") -> None:
        entries, offset = [], 0
        for key, space in dict_space.spaces.items():
            if not isinstance(space, gym.spaces.Box):
                raise ConfigError(f"{env_id}'s Dict observation entry {key!r} is {space}; with images in the Dict, "
                                  "rlcli takes Box entries only (wrap the env to turn it into a Box)")
            entries.append(Entry(key, tuple(space.shape), np.dtype(space.dtype), offset, is_image(space)))
            offset += entries[-1].nbytes
        super().__init__(0, 255, (offset,), np.uint8)
        self.dict_space, self.entries = dict_space, tuple(entries)

    def pack(self, obs: dict[str, Any]) -> np.ndarray:
        """A batch of Dict observations ({key: [N, ...]}) -> [N, bytes] uint8."""
        n = len(next(iter(obs.values())))
        return np.concatenate([np.ascontiguousarray(obs[e.key], dtype=e.dtype).reshape(n, -1).view(np.uint8)
                               for e in self.entries], axis=1)

    def unpack(self, packed: np.ndarray) -> dict[str, np.ndarray]:
        """The inverse of `pack` (numpy): what the env gave, bit for bit."""
        n = packed.shape[0]
        return {e.key: np.ascontiguousarray(packed[:, e.offset:e.offset + e.nbytes]).view(e.dtype).reshape(n, *e.shape)
                for e in self.entries}

    def __repr__(self) -> str:
        return f"PackedDict({self.dict_space})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PackedDict) and self.dict_space == other.dict_space


def pack_dict_observations(envs: VectorEnv, env_id: str) -> VectorEnv:
    """Observations of a Dict space with images, packed into one uint8 vector per env (see the module doc)."""
    space = PackedDict(envs.single_observation_space, env_id)  # type: ignore[arg-type]
    batched = gym.spaces.Box(0, 255, (envs.num_envs, space.shape[0]), np.uint8)
    return gym.wrappers.vector.TransformObservation(envs, space.pack, observation_space=batched,
                                                    single_observation_space=space)
