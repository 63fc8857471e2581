"""A dataset of transitions in memory: what every reader returns and every writer takes.

Flat arrays over all episodes, row i being one transition (obs, action, reward, next_obs). `terminations` and
`truncations` keep gymnasium's meaning: a terminated transition has no bootstrap, a truncated one ends its episode
but still bootstraps from `next_observations`. Episode boundaries are where either is true (the last row of the
dataset always ends an episode).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Dataset:
    observations: np.ndarray  # [N, *obs_shape], the env's observation dtype (float32, or uint8 for pixels)
    actions: np.ndarray  # [N, *action_shape] float32 (Box) or [N] int64 (Discrete)
    rewards: np.ndarray  # [N] float32
    next_observations: np.ndarray  # [N, *obs_shape]
    terminations: np.ndarray  # [N] bool
    truncations: np.ndarray  # [N] bool
    env_id: str | None = None  # the gymnasium id it was recorded on (None: unknown, e.g. a bare .npz)
    ref_min_score: float | None = None  # a random policy's mean return: the D4RL normalized score's 0
    ref_max_score: float | None = None  # an expert's mean return: the normalized score's 100
    name: str = "dataset"  # its id (Minari) or file name, for messages
    metadata: dict[str, object] = field(default_factory=dict)  # what made it (algo, checkpoint, noise, seed)

    def __len__(self) -> int:
        return int(self.rewards.shape[0])

    @property
    def episode_ends(self) -> np.ndarray:
        """Indices of each episode's last transition."""
        ends = self.terminations | self.truncations
        ends = ends.copy()
        if len(ends):
            ends[-1] = True
        return np.flatnonzero(ends)

    def normalized_score(self, episode_return: float) -> float | None:
        """D4RL's normalized score, 100 * (R - ref_min) / (ref_max - ref_min); None without reference scores."""
        if self.ref_min_score is None or self.ref_max_score is None or self.ref_max_score == self.ref_min_score:
            return None
        return 100.0 * (episode_return - self.ref_min_score) / (self.ref_max_score - self.ref_min_score)
