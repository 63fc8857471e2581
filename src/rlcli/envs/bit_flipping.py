"""The bit-flipping task of the HER paper (Andrychowicz et al. 2017), as a goal-conditioned env.

State and goal are n bits; action i flips bit i; the reward is -1 until the state equals the goal,
then 0 and the episode ends; episodes last at most n steps. With n = 15 a random policy almost never
sees a reward, which is what makes it the standard test of hindsight relabeling. `continuous=True` (as
Stable-Baselines3's test env): the actions are n numbers in [-1, 1] and every bit whose number is > 0 flips, a
goal task for the continuous-action algorithms (SAC, TD3, ...).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class BitFlippingEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, n_bits: int = 10, max_steps: int | None = None, continuous: bool = False):
        self.n_bits, self.continuous = n_bits, continuous
        self.max_steps = n_bits if max_steps is None else max_steps
        bits = gym.spaces.Box(0.0, 1.0, (n_bits,), np.float32)
        self.observation_space = gym.spaces.Dict({"observation": bits, "achieved_goal": bits, "desired_goal": bits})
        self.action_space: gym.spaces.Space = (gym.spaces.Box(-1.0, 1.0, (n_bits,), np.float32) if continuous
                                               else gym.spaces.Discrete(n_bits))
        self.state = np.zeros(n_bits, np.float32)
        self.goal = np.zeros(n_bits, np.float32)
        self.steps = 0

    def _obs(self) -> dict[str, np.ndarray]:
        return {"observation": self.state.copy(), "achieved_goal": self.state.copy(), "desired_goal": self.goal.copy()}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.state = self.np_random.integers(0, 2, self.n_bits).astype(np.float32)
        self.goal = self.np_random.integers(0, 2, self.n_bits).astype(np.float32)
        while np.array_equal(self.state, self.goal):
            self.goal = self.np_random.integers(0, 2, self.n_bits).astype(np.float32)
        self.steps = 0
        return self._obs(), {}

    def step(self, action: Any):
        flip = np.asarray(action).reshape(-1) > 0 if self.continuous else int(action)
        self.state[flip] = 1.0 - self.state[flip]
        self.steps += 1
        reward = float(self.compute_reward(self.state, self.goal, {}))
        terminated = bool(self.compute_terminated(self.state, self.goal, {}))
        return self._obs(), reward, terminated, self.steps >= self.max_steps and not terminated, {
            "is_success": terminated}

    def compute_reward(self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any) -> np.ndarray:
        """Vectorized over leading dimensions, as goal-env relabeling needs."""
        return -(np.abs(achieved_goal - desired_goal).sum(-1) > 0.5).astype(np.float32)

    def compute_terminated(self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any) -> np.ndarray:
        return np.abs(achieved_goal - desired_goal).sum(-1) < 0.5


gym.register("BitFlipping-v0", entry_point=BitFlippingEnv)
