"""MatchDigits-v0 and MatchBits-v0: the smallest tasks with MultiDiscrete and MultiBinary actions.

Each step shows `entries` target digits (in [0, digits), scaled to [0, 1]) and pays the fraction of
the action's entries that equal them; an episode is 10 steps, so the best return is 10 and a random
policy gets 10 / digits. MatchBits-v0 is the same with bits (digits=2) and a MultiBinary action.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class MatchDigitsEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, entries: int = 3, digits: int = 3, binary: bool = False, length: int = 10):
        self.entries, self.digits, self.length = entries, 2 if binary else digits, length
        self.observation_space = gym.spaces.Box(0.0, 1.0, (entries,), np.float32)
        self.action_space: gym.spaces.Space = (gym.spaces.MultiBinary(entries) if binary
                                               else gym.spaces.MultiDiscrete([self.digits] * entries))
        self.target = np.zeros(entries, np.int64)
        self.t = 0

    def _observe(self) -> np.ndarray:
        self.target = self.np_random.integers(0, self.digits, self.entries)
        return (self.target / (self.digits - 1)).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self._observe(), {}

    def step(self, action: Any):
        reward = float(np.mean(np.asarray(action).reshape(-1) == self.target))
        self.t += 1
        return self._observe(), reward, False, self.t >= self.length, {}


gym.register("MatchDigits-v0", entry_point=MatchDigitsEnv, reward_threshold=9.5)
gym.register("MatchBits-v0", entry_point=MatchDigitsEnv, kwargs={"binary": True, "entries": 4}, reward_threshold=9.5)
