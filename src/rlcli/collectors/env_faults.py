"""What the collector says when an env fails: the env raised, or returned what training cannot use (a
non-finite value, a wrong shape), as one line naming the env and the env step."""

from __future__ import annotations

from typing import Any

import numpy as np


class CollectorError(RuntimeError):
    """The collector cannot go on (collector=ray: a worker keeps dying): the trainer stops with this one line."""


class EnvError(CollectorError):
    """The env raised, or returned what training cannot use (a non-finite value, a wrong shape); the message
    names the env step within the collect phase (`step`) and what happened."""

    def __init__(self, message: str, step: int) -> None:
        super().__init__(message)
        self.step = step


def env_name(envs: Any) -> str:
    spec = getattr(envs, "spec", None)
    return str(getattr(spec, "id", None) or type(envs).__name__)


def raised(error: Exception) -> str:
    """`raised RuntimeError: <the last line of its message>`."""
    detail = str(error).strip().splitlines()
    return f"raised {type(error).__name__}" + (f": {detail[-1]}" if detail else "")


def timed_out(seconds: float, where: str = "a step") -> str:
    """`did not return from a step within train.step_timeout=30 s` (the trainer adds the env and the env step)."""
    return f"did not return from {where} within train.step_timeout={seconds:g} s"


def check_env_output(obs: Any, rewards: np.ndarray, expected_shape: tuple[int, ...] | None, step: int) -> None:
    """One line naming what is wrong with a step's output (cheap: a few numpy reductions per vector step)."""
    if isinstance(obs, np.ndarray):
        if expected_shape is not None and obs.shape != expected_shape:
            raise EnvError(f"returned observations of shape {obs.shape}; its observation space says {expected_shape}",
                           step)
        if obs.dtype.kind == "f" and not np.isfinite(obs).all():
            bad = np.flatnonzero(~np.isfinite(obs).reshape(len(obs), -1).all(axis=1))
            raise EnvError(f"returned a non-finite observation (env {int(bad[0])}: "
                           f"{obs[bad[0]].ravel()[:6].tolist()})", step)
    elif isinstance(obs, dict):
        for key, value in obs.items():
            if isinstance(value, np.ndarray) and value.dtype.kind == "f" and not np.isfinite(value).all():
                raise EnvError(f"returned a non-finite observation in {key!r}", step)
    rewards = np.asarray(rewards)
    if rewards.dtype.kind == "f" and not np.isfinite(rewards).all():
        bad = int(np.flatnonzero(~np.isfinite(rewards))[0])
        raise EnvError(f"returned a non-finite reward (env {bad}: {rewards[bad]})", step)
