"""Test-only gymnasium envs, registered on import: used as `env.id=odd_envs:MultiBinaryToy-v0`."""

import gymnasium as gym
import numpy as np


class MultiBinaryToy(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.MultiBinary(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, True, False, {}


gym.register("MultiBinaryToy-v0", entry_point=MultiBinaryToy)


class CrashAfter(gym.Wrapper):
    """CartPole that raises after `crash_after` steps: a job that fails mid-run in a sweep."""

    def __init__(self, crash_after: int = 100):
        super().__init__(gym.make("CartPole-v1"))
        self.crash_after, self.steps = crash_after, 0

    def step(self, action):
        self.steps += 1
        if self.steps > self.crash_after:
            raise RuntimeError(f"simulated crash after {self.crash_after} steps")
        return self.env.step(action)


gym.register("CrashAfter-v0", entry_point=CrashAfter, max_episode_steps=500)
