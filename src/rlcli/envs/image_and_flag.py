"""ImageAndFlag-v0: a task that needs an image and a vector together (a Dict observation), in seconds.

Each step shows a 1 x 7 x 7 uint8 image with one lit pixel in its left or right half (`"image"`) and a
flag of -1 or +1 (`"flag"`, float32). The right action is "right" when the pixel is right and the flag
is +1, or the pixel is left and the flag is -1; "left" otherwise: neither input alone tells it. Ten steps
per episode, +1 for each right action: a policy that reads both earns 10, one that reads either alone 5.
`continuous=True`: one action in [-1, 1], paying 1 - |action - target| / 2 with target -1 (left) or +1.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class ImageAndFlagEnv(gym.Env):  # type: ignore[type-arg]
    metadata = {"render_modes": []}

    def __init__(self, size: int = 7, length: int = 10, continuous: bool = False) -> None:
        self.size, self.length, self.continuous = size, length, continuous
        self.observation_space = gym.spaces.Dict({
            "image": gym.spaces.Box(0, 255, (1, size, size), np.uint8),
            "flag": gym.spaces.Box(-1.0, 1.0, (1,), np.float32),
        })
        self.action_space: gym.spaces.Space = (gym.spaces.Box(-1.0, 1.0, (1,), np.float32) if continuous
                                               else gym.spaces.Discrete(2))
        self.steps, self.target = 0, 0

    def _obs(self) -> dict[str, np.ndarray]:
        right, flag = bool(self.np_random.integers(2)), float(self.np_random.choice([-1.0, 1.0]))
        image = np.zeros((1, self.size, self.size), np.uint8)
        half = self.size // 2
        column = self.np_random.integers(half + 1, self.size) if right else self.np_random.integers(0, half)
        image[0, self.np_random.integers(self.size), column] = 255
        self.target = int(right == (flag > 0))  # 1: "right", 0: "left"
        return {"image": image, "flag": np.array([flag], np.float32)}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.steps = 0
        return self._obs(), {}

    def step(self, action: Any):
        if self.continuous:
            reward = 1.0 - abs(float(np.asarray(action).reshape(-1)[0]) - (2 * self.target - 1)) / 2
        else:
            reward = float(int(action) == self.target)
        self.steps += 1
        return self._obs(), reward, False, self.steps >= self.length, {}


gym.register("ImageAndFlag-v0", entry_point=ImageAndFlagEnv, reward_threshold=9.5)
