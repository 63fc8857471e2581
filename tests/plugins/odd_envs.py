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
