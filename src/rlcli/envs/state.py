"""Save and restore the state of a vector env and its wrappers, for exact resume.

Walks the wrapper chain (vector wrappers, the vector env, and for SyncVectorEnv every sub-env with
its own wrappers) and records each object's attributes as plain data (plain_state.py): RNGs,
physics state, step counters, episode statistics, reward-normalization statistics. Envs that cannot be captured this way
(AsyncVectorEnv keeps its sub-envs in other processes) are reported so the trainer can warn and
reset them instead.
"""

from __future__ import annotations

import pickle
from typing import Any

import gymnasium
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv

from rlcli.services.plain_state import encode, restore_into

# Structure, rendering and spaces: rebuilt from the config, never part of the state.
_SKIP = {
    "env", "envs", "env_fns", "_env_fns", "spec", "metadata", "render_mode", "screen", "screens", "clock", "surf",
    "observation_space", "action_space", "single_observation_space", "single_action_space",
    "_observation_space", "_action_space", "_metadata", "_cached_spec", "episode_start_times",
    "obs_layouts", "_all_layouts",  # env=pz: how each agent's observation becomes numbers (envs/multiagent.py)
}


def _layers(envs: Any) -> list[Any]:
    layers, obj = [], envs
    while obj is not None:
        layers.append(obj)
        if isinstance(obj, SyncVectorEnv):
            for sub in obj.envs:
                while sub is not None:
                    layers.append(sub)
                    sub = getattr(sub, "env", None)
            break
        if hasattr(obj, "copies"):  # env=pz: each copy's wrapper chain (envs/multiagent.py)
            from rlcli.envs.multiagent import copy_layers

            for copy in obj.copies:
                layers.extend(copy_layers(copy))
            break
        obj = getattr(obj, "env", None)
    return layers


_STRUCTURE_TYPES = ("MjModel", "MujocoRenderer")  # rebuilt from the config, like the spaces


def _encoded(value: Any) -> Any:
    """The attribute as plain data (see plain_state.py), or None for structure and what has no plain form."""
    if isinstance(value, gymnasium.Space) or type(value).__name__ in _STRUCTURE_TYPES:
        return None
    try:
        pickle.dumps(value)  # what cannot be copied at all (a Box2D world, a C++ handle) is not state we can keep
        return encode(value, objects=True)
    except Exception:  # noqa: BLE001  (Unsupported, or whatever an exotic object raises when walked)
        return None


def capturable(envs: Any) -> bool:
    """False for async vector envs (sub-envs live in other processes), Atari (the emulator's state is not a
    plain attribute) and EnvPool (C++): the trainer then resets them on resume, and says so."""
    return not any(isinstance(layer, AsyncVectorEnv) or hasattr(layer, "ale")
                   or not getattr(layer, "state_capturable", True) for layer in _layers(envs))


def get_env_state(envs: Any) -> list[dict[str, Any]]:
    """One dict of attributes per layer, in a fixed order that `set_env_state` relies on."""
    states = []
    for layer in _layers(envs):
        attrs = {k: _encoded(v) for k, v in vars(layer).items() if k not in _SKIP}
        state = {"type": type(layer).__qualname__,
                 "attrs": {k: v for k, v in attrs.items() if v is not None or getattr(layer, k) is None}}
        if hasattr(layer, "capture_state"):  # state beyond its attributes, as tensors and plain values (envs/vmas.py)
            state["own"] = layer.capture_state()
        states.append(state)
    return states


def set_env_state(envs: Any, states: list[dict[str, Any]]) -> None:
    layers = _layers(envs)
    kinds = [type(layer).__qualname__ for layer in layers]
    if kinds != [s["type"] for s in states]:
        raise ValueError(f"env layout changed since the checkpoint: {kinds} vs {[s['type'] for s in states]}")
    for layer, state in zip(layers, states, strict=True):
        for key, value in state["attrs"].items():
            setattr(layer, key, restore_into(getattr(layer, key, None), value))
        if "own" in state:
            layer.restore_state(state["own"])
