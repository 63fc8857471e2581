"""ValidMoves-v0: a task whose optimal policy needs the action mask, for invalid-action masking.

Each step, `n_valid` of the `n_actions` actions are valid. The valid action with the lowest index
pays 1, any other valid action 0; an invalid action ends the episode. The observation is the valid
set (a 0/1 vector). An episode lasts at most `length` steps, so the best return is `length`.
With the mask, the best policy is one fixed preference order (lower index first) over whatever is
valid; without it, the policy has to learn to find the lowest set bit of its observation, and a
uniformly random one ends its episode at once with probability 1 - n_valid / n_actions.

With `entries` > 1 (ValidMovesMulti-v0) the action is MultiDiscrete: each entry has its own valid set (the
observation and the mask are the entries' side by side), an entry choosing its lowest valid action pays
1 / entries, and an invalid choice in any entry ends the episode.

The mask is offered in the convention `mask_in` names, the three that users' envs follow:
`method` (an `action_masks()` method, sb3-contrib's), `info` (`info["action_mask"]`) or `obs` (a Dict
observation {"observation", "action_mask"}).
"""

from __future__ import annotations

from typing import Any, Literal

import gymnasium as gym
import numpy as np


class ValidMovesEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, n_actions: int = 12, n_valid: int = 4, length: int = 20,
                 mask_in: Literal["method", "info", "obs"] = "method", entries: int = 1):
        if not 1 <= n_valid <= n_actions:
            raise ValueError(f"n_valid={n_valid} must be in [1, n_actions={n_actions}]")
        if mask_in not in ("method", "info", "obs"):
            raise ValueError(f"mask_in={mask_in!r}: choose from method, info, obs")
        if entries < 1:
            raise ValueError(f"entries={entries} must be >= 1")
        self.n_actions, self.n_valid, self.length, self.mask_in = n_actions, n_valid, length, mask_in
        self.entries = entries
        flat = gym.spaces.Box(0.0, 1.0, (n_actions * entries,), np.float32)
        self.observation_space: gym.spaces.Space[Any] = flat
        if mask_in == "obs":
            self.observation_space = gym.spaces.Dict(
                {"observation": flat, "action_mask": gym.spaces.MultiBinary(n_actions * entries)})
        self.action_space: gym.spaces.Space[Any] = (
            gym.spaces.Discrete(n_actions) if entries == 1 else gym.spaces.MultiDiscrete([n_actions] * entries))
        self.valid = np.zeros(n_actions * entries, dtype=bool)
        self.best = np.zeros(entries, dtype=np.int64)
        self.t = 0

    def action_masks(self) -> np.ndarray:
        """The valid actions now (sb3-contrib's convention; offered whatever `mask_in` says)."""
        return self.valid.copy()

    def _draw(self) -> tuple[Any, dict[str, Any]]:
        self.valid = np.zeros((self.entries, self.n_actions), dtype=bool)
        for entry in range(self.entries):
            valid = self.np_random.choice(self.n_actions, self.n_valid, replace=False)
            self.valid[entry, valid] = True
            self.best[entry] = int(valid.min())
        self.valid = self.valid.reshape(-1)
        obs = self.valid.astype(np.float32)
        if self.mask_in == "obs":
            return {"observation": obs, "action_mask": self.valid.astype(np.int8)}, {}
        if self.mask_in == "info":
            return obs, {"action_mask": self.valid.copy()}
        return obs, {}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self._draw()

    def step(self, action: Any):
        chosen = np.asarray(action, dtype=np.int64).reshape(-1)
        if not self.valid.reshape(self.entries, self.n_actions)[np.arange(self.entries), chosen].all():
            obs, info = self._draw()
            return obs, 0.0, True, False, info
        reward = float(np.mean(chosen == self.best))
        self.t += 1
        obs, info = self._draw()
        return obs, reward, False, self.t >= self.length, info


gym.register("ValidMoves-v0", entry_point=ValidMovesEnv, reward_threshold=18.0)
gym.register("ValidMovesMulti-v0", entry_point=ValidMovesEnv, kwargs={"entries": 3, "n_actions": 6, "n_valid": 2},
             reward_threshold=18.0)
