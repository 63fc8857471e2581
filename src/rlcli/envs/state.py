"""Save and restore the state of a vector env and its wrappers, for exact resume.

Walks the wrapper chain (vector wrappers, the vector env, and for SyncVectorEnv every sub-env with
its own wrappers) and copies each object's plain attributes: RNGs, physics state, step counters,
episode statistics, reward-normalization statistics. Envs that cannot be captured this way
(AsyncVectorEnv keeps its sub-envs in other processes) are reported so the trainer can warn and
reset them instead.
"""

from __future__ import annotations

import copy
import pickle
from typing import Any

from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv

# Structure, rendering and spaces: rebuilt from the config, never part of the state.
_SKIP = {
    "env", "envs", "env_fns", "_env_fns", "spec", "metadata", "render_mode", "screen", "screens", "clock", "surf",
    "observation_space", "action_space", "single_observation_space", "single_action_space",
    "_observation_space", "_action_space", "_metadata", "_cached_spec", "episode_start_times",
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
        obj = getattr(obj, "env", None)
    return layers


def _picklable(value: Any) -> bool:
    try:
        pickle.dumps(value)
    except Exception:
        return False
    return True


def capturable(envs: Any) -> bool:
    """False for async vector envs (sub-envs live in other processes), Atari (the emulator's state is not a
    plain attribute) and EnvPool (C++): the trainer then resets them on resume, and says so."""
    return not any(isinstance(layer, AsyncVectorEnv) or hasattr(layer, "ale")
                   or not getattr(layer, "state_capturable", True) for layer in _layers(envs))


def get_env_state(envs: Any) -> list[dict[str, Any]]:
    """One dict of attributes per layer, in a fixed order that `set_env_state` relies on."""
    states = []
    for layer in _layers(envs):
        attrs = {k: v for k, v in vars(layer).items() if k not in _SKIP and _picklable(v)}
        states.append({"type": type(layer).__qualname__, "attrs": copy.deepcopy(attrs)})
    return states


def set_env_state(envs: Any, states: list[dict[str, Any]]) -> None:
    layers = _layers(envs)
    kinds = [type(layer).__qualname__ for layer in layers]
    if kinds != [s["type"] for s in states]:
        raise ValueError(f"env layout changed since the checkpoint: {kinds} vs {[s['type'] for s in states]}")
    for layer, state in zip(layers, states, strict=True):
        for key, value in copy.deepcopy(state["attrs"]).items():
            setattr(layer, key, value)
