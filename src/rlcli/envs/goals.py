"""Goal-conditioned envs (a Dict with observation / achieved_goal / desired_goal and `compute_reward`): where each
part sits in the flattened observation, for HER's relabelling."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import VectorEnv


@dataclass
class GoalLayout:
    """Where a flattened goal-env observation keeps its goals, and the env's reward function."""

    achieved: slice
    desired: slice
    compute_reward: Callable[[np.ndarray, np.ndarray, Any], np.ndarray]
    compute_terminated: Callable[[np.ndarray, np.ndarray, Any], np.ndarray] | None


def goal_layout(envs: VectorEnv) -> GoalLayout | None:
    """For Dict observations with observation / achieved_goal / desired_goal, their flat slices."""
    space = envs.single_observation_space
    if not isinstance(space, gym.spaces.Dict) or not {"achieved_goal", "desired_goal"} <= set(space.spaces):
        return None
    slices, start = {}, 0
    for key, sub in space.spaces.items():  # the order gymnasium's flatten uses
        size = gym.spaces.flatdim(sub)
        slices[key] = slice(start, start + size)
        start += size
    base = envs
    while not hasattr(base, "envs") and hasattr(base, "env"):
        base = base.env
    if not hasattr(base, "envs"):
        return None  # async or custom vector envs: no local env to ask for compute_reward
    env = base.envs[0].unwrapped
    if not hasattr(env, "compute_reward"):
        return None
    return GoalLayout(slices["achieved_goal"], slices["desired_goal"], env.compute_reward,
                      getattr(env, "compute_terminated", None))
