"""A CartPole-like env that stops answering at its own step `at`, for the timeout and Ctrl-C tests:
`env=gym env.id=hung_env:Hung-v0 +env.kwargs.at=<step> +env.kwargs.how=<sleep|spin>` (sleep: blocked in a system
call, as a simulator waiting on a socket; spin: a busy Python loop, as one stuck in its own code)."""

import contextlib
import time

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import register


class HungEnv(gym.Env):
    def __init__(self, at: int = 100, how: str = "sleep", where: str = "train"):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.at, self.how, self.steps, self.t = at, how, 0, 0
        self.where, self.testing = where, False

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.testing = seed >= 100_000
        self.t = 0
        return self.np_random.normal(size=4).astype(np.float32), {}

    def step(self, action):
        self.steps += 1
        self.t += 1
        if self.steps == self.at and self.testing == (self.where == "test"):
            if self.how == "sleep":
                # an env that swallows exceptions around its wait must not keep the timeout from working
                with contextlib.suppress(Exception):
                    time.sleep(3600)
            else:
                while True:
                    pass
        return self.np_random.normal(size=4).astype(np.float32), 1.0, False, self.t >= 50, {}


register("Hung-v0", entry_point=HungEnv)
