"""Checks a dataset passes before anything trains on it: a bad array found here is one line naming the dataset,
the field, the value and what was expected, instead of a shape error or a NaN loss thousands of steps later.

`check_dataset` needs nothing but the arrays (every reader calls it); `check_against_env` also needs the env's
spaces, which only the code that builds the env has.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlcli.offline.dataset import Dataset
from rlcli.registry import ConfigError

FIELDS = ("observations", "actions", "rewards", "next_observations", "terminations", "truncations")


def _short(value: Any) -> str:
    """A value as a message shows it: numbers as numpy prints them, no long arrays."""
    text = np.array2string(np.asarray(value), threshold=6, edgeitems=2, precision=4, max_line_width=10_000)
    return " ".join(text.split())


def _fail(dataset: Dataset, field: str, message: str) -> ConfigError:
    return ConfigError(f"dataset {dataset.name!r}: {field} {message}")


def check_dataset(dataset: Dataset) -> Dataset:
    """Shapes, dtypes, finiteness and episode flags of every field; returns `dataset` so readers can chain it.

    Raises ConfigError (one line) at the first problem."""
    arrays = {name: getattr(dataset, name) for name in FIELDS}
    for name, array in arrays.items():
        if not isinstance(array, np.ndarray):
            raise _fail(dataset, name, f"is a {type(array).__name__}, expected a numpy array")
        if array.ndim == 0:
            raise _fail(dataset, name, f"is a scalar ({_short(array)}), expected one row per transition")
        if array.dtype.kind not in "biuf":
            raise _fail(dataset, name, f"has dtype {array.dtype}, expected numbers (bool, int or float)")
    n = len(arrays["rewards"])
    if n == 0:
        raise _fail(dataset, "rewards", "is empty (0 transitions), expected at least one transition")
    for name, array in arrays.items():
        if len(array) != n:
            raise _fail(dataset, name, f"has {len(array)} rows, expected {n} (as rewards has)")
    for name in ("rewards", "terminations", "truncations"):
        if arrays[name].ndim != 1:
            raise _fail(dataset, name, f"has shape {arrays[name].shape}, expected ({n},): one value per transition")
    obs, next_obs = arrays["observations"], arrays["next_observations"]
    if obs.shape != next_obs.shape:
        raise _fail(dataset, "next_observations", f"has shape {next_obs.shape}, expected {obs.shape} (as "
                                                  "observations has)")
    if obs.dtype != next_obs.dtype:
        raise _fail(dataset, "next_observations", f"has dtype {next_obs.dtype}, expected {obs.dtype} (as "
                                                  "observations has)")
    for name, array in arrays.items():
        if array.dtype.kind == "f":
            bad = ~np.isfinite(array)
            if bad.any():
                where = tuple(int(i) for i in np.argwhere(bad)[0])
                raise _fail(dataset, name, f"holds {array[where]} at row {where[0]}"
                                           f"{f' index {list(where[1:])}' if len(where) > 1 else ''}, expected "
                                           "finite numbers")
    for name in ("terminations", "truncations"):
        array = arrays[name]
        if array.dtype.kind != "b":
            odd = np.flatnonzero((array != 0) & (array != 1))
            if odd.size:
                raise _fail(dataset, name, f"holds {_short(array[odd[0]])} at row {int(odd[0])}, expected a boolean "
                                           "(True/False or 0/1)")
    both = np.flatnonzero(arrays["terminations"].astype(bool) & arrays["truncations"].astype(bool))
    if both.size:
        raise _fail(dataset, "terminations", f"and truncations are both true at row {int(both[0])} ({both.size} "
                                             "rows), expected at most one: a terminated step has no bootstrap, a "
                                             "truncated one has")
    return dataset


def discrete_actions(dataset: Dataset) -> bool:
    """Integer actions of one value per row: a Discrete action space's."""
    return dataset.actions.dtype.kind in "iu" and dataset.actions.ndim == 1


def check_against_env(dataset: Dataset, observation_space: Any, action_space: Any) -> None:
    """The dataset fits the env it will be tested in: observation shape, action shape and dtype, Box action bounds,
    Discrete actions in range. Raises ConfigError (one line) at the first mismatch."""
    import gymnasium

    env = f" of env {dataset.env_id}" if dataset.env_id else ""
    obs_shape = tuple(observation_space.shape or ())
    if tuple(dataset.observations.shape[1:]) != obs_shape:
        raise _fail(dataset, "observations", f"have shape {tuple(dataset.observations.shape[1:])} per row, expected "
                                             f"{obs_shape} (the observation space{env}: {observation_space})")
    actions = dataset.actions
    if isinstance(action_space, gymnasium.spaces.Discrete):
        if not discrete_actions(dataset):
            raise _fail(dataset, "actions", f"have dtype {actions.dtype} and shape {tuple(actions.shape[1:])} per row, "
                                            f"expected one integer per row (the action space{env}: {action_space})")
        low, high = int(action_space.start), int(action_space.start + action_space.n - 1)
        bad = np.flatnonzero((actions < low) | (actions > high))
        if bad.size:
            raise _fail(dataset, "actions", f"hold {_short(actions[bad[0]])} at row {int(bad[0])}, expected an "
                                            f"integer in [{low}, {high}] (the action space{env}: {action_space})")
        return
    if isinstance(action_space, gymnasium.spaces.Box):
        shape = tuple(action_space.shape)
        if actions.dtype.kind != "f":
            raise _fail(dataset, "actions", f"have dtype {actions.dtype}, expected floats (the action space{env}: "
                                            f"{action_space})")
        if tuple(actions.shape[1:]) != shape:
            raise _fail(dataset, "actions", f"have shape {tuple(actions.shape[1:])} per row, expected {shape} (the "
                                            f"action space{env}: {action_space})")
        lows = np.broadcast_to(action_space.low, shape)
        highs = np.broadcast_to(action_space.high, shape)
        outside = (actions < lows) | (actions > highs)
        if outside.any():
            where = tuple(int(i) for i in np.argwhere(outside)[0])
            index = where[1:]
            raise _fail(dataset, "actions", f"hold {actions[where]} at row {where[0]}"
                                            f"{f' index {list(index)}' if index else ''}, expected within "
                                            f"[{lows[index]}, {highs[index]}] (the action space{env}'s bounds)")
        return
    raise _fail(dataset, "actions", f"cannot be checked against {action_space}: rlcli's datasets hold Box or "
                                    "Discrete actions")
