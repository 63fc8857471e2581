"""Valid-action masks from an env, in whichever of the three common conventions it uses.

`ActionMaskInInfo` wraps one env so that every reset and step carries `info["action_mask"]` (a
bool array over the Discrete actions; for MultiDiscrete actions every entry's mask side by side, as
sb3-contrib's MaskablePPO takes it), read from:
  * a Dict observation with an "action_mask" key (the key is taken out of the observation; what
    is left is the observation the network sees),
  * an `action_masks()` method (sb3-contrib's convention),
  * or the env's own `info["action_mask"]`.
The vector env then stacks the masks like any info entry, and the collector reads them there.
"""

from __future__ import annotations

from typing import Any, Literal

import gymnasium as gym
import numpy as np

from rlcli.registry import ConfigError

MASK_KEY = "action_mask"
HOW_TO = ("an action_masks() method, an 'action_mask' entry in info, or a Dict observation with an "
          "'action_mask' key")


def mask_width(space: gym.spaces.Space) -> int:
    """Entries in a mask for these actions: Discrete(n): n; MultiDiscrete(nvec): sum(nvec)."""
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(np.asarray(space.nvec).sum())
    return int(space.n)  # type: ignore[attr-defined]


def mask_convention(env: gym.Env) -> Literal["obs", "method", "info"]:
    """Where this env's mask comes from (`info` is checked at the first reset)."""
    space = env.observation_space
    if isinstance(space, gym.spaces.Dict) and MASK_KEY in space.spaces:
        return "obs"
    try:
        env.get_wrapper_attr("action_masks")
        return "method"
    except AttributeError:
        return "info"


class ActionMaskInInfo(gym.Wrapper):
    def __init__(self, env: gym.Env, env_id: str):
        super().__init__(env)
        if not isinstance(env.action_space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
            raise ConfigError(f"action masks need Discrete or MultiDiscrete actions; env {env_id} has "
                              f"{type(env.action_space).__name__} actions")
        self.env_id, self.n = env_id, mask_width(env.action_space)
        self.convention = mask_convention(env)
        if self.convention == "obs":
            rest = {k: v for k, v in env.observation_space.spaces.items() if k != MASK_KEY}
            # one entry left: that is the observation; several: a Dict (flattened by the vector env)
            self.observation_space = next(iter(rest.values())) if len(rest) == 1 else gym.spaces.Dict(rest)

    def _with_mask(self, obs: Any, info: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        if self.convention == "obs":
            mask = obs[MASK_KEY]
            rest = {k: v for k, v in obs.items() if k != MASK_KEY}
            obs = next(iter(rest.values())) if len(rest) == 1 else rest
        elif self.convention == "method":
            mask = self.env.get_wrapper_attr("action_masks")()
        elif MASK_KEY in info:
            mask = info[MASK_KEY]
        else:
            raise ConfigError(f"this algorithm needs valid-action masks, and env {self.env_id} gives none: give it "
                              f"{HOW_TO}")
        mask = np.asarray(mask, dtype=bool).reshape(-1)
        if mask.shape != (self.n,):
            raise ConfigError(f"env {self.env_id} gave an action mask of shape {mask.shape}; it needs one entry per "
                              f"action (MultiDiscrete: per entry's action, side by side): ({self.n},)")
        return obs, {**info, MASK_KEY: mask}

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        return self._with_mask(obs, info)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        obs, info = self._with_mask(obs, info)
        return obs, reward, terminated, truncated, info  # type: ignore[return-value]


def masks_from_infos(infos: dict[str, Any], n_envs: int, n_actions: int) -> np.ndarray:
    """[n_envs, n_actions] bool from a vector env's infos; an env whose mask allows nothing gets all
    actions (its step is a reset step or its episode is over: the action is ignored either way)."""
    if MASK_KEY not in infos:
        raise ConfigError(f"the vector env's info has no '{MASK_KEY}' entry; the env must give {HOW_TO}")
    masks = np.asarray(infos[MASK_KEY], dtype=bool).reshape(n_envs, n_actions)
    present = infos.get(f"_{MASK_KEY}")
    if present is not None:
        masks = np.where(np.asarray(present, dtype=bool)[:, None], masks, True)
    return np.where(masks.any(axis=1, keepdims=True), masks, True)
