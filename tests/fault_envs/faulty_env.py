"""A CartPole-like env that misbehaves on request, for the fault tests: `env=gym env.id=faulty_env:Faulty-v0
env.kwargs.fault=<raise|nan_obs|inf_reward|bad_shape_reset|bad_shape_step> env.kwargs.at=<its own step>`."""

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import register


class FaultyEnv(gym.Env):
    def __init__(self, fault: str = "none", at: int = 100):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.fault, self.at, self.steps, self.t = fault, at, 0, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        shape = (5,) if self.fault == "bad_shape_reset" else (4,)
        return self.np_random.normal(size=shape).astype(np.float32), {}

    def step(self, action):
        self.steps += 1
        self.t += 1
        obs = self.np_random.normal(size=4).astype(np.float32)
        reward = 1.0
        if self.steps >= self.at:
            if self.fault == "raise":
                raise RuntimeError("simulator exploded")
            if self.fault == "nan_obs":
                obs[1] = np.nan
            if self.fault == "inf_reward":
                reward = float("inf")
            if self.fault == "bad_shape_step":
                obs = np.zeros(7, dtype=np.float32)
        return obs, reward, False, self.t >= 50, {}


register("Faulty-v0", entry_point=FaultyEnv)
