"""MemoryCue-v0: the smallest task that needs memory, for testing recurrent agents in seconds.

The first observation shows a cue (-1 or +1); the next `delay` observations show nothing; the last
one asks a question (its second entry is 1). Answering with the action matching the cue (0 for -1,
1 for +1) pays 1, anything else 0, and the episode ends. Actions before the question do nothing.
A memoryless policy cannot beat 0.5 on average; one that remembers the cue gets 1.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class MemoryCueEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, delay: int = 4):
        self.delay = delay
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.cue = 1.0
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.cue = float(self.np_random.choice([-1.0, 1.0]))
        self.t = 0
        return np.array([self.cue, 0.0], np.float32), {}

    def step(self, action: int):
        if self.t == self.delay + 1:  # the question was shown: this is the answer
            reward = 1.0 if int(action) == int(self.cue > 0) else 0.0
            return np.zeros(2, np.float32), reward, True, False, {}
        self.t += 1
        question = self.t == self.delay + 1
        return np.array([0.0, 1.0 if question else 0.0], np.float32), 0.0, False, False, {}


gym.register("MemoryCue-v0", entry_point=MemoryCueEnv, reward_threshold=0.95)
