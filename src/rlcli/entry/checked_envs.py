"""The envs that rl-eval, rlcli.evaluate and the export check step, checked as training's collector checks them:
an env that raises, or returns an observation or reward that is not a finite real number, stops the evaluation
with one line naming the env, the step and the episode (a NaN observation otherwise scores as action 0's return)."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.vector import VectorEnv, VectorWrapper

from rlcli.collectors.env_faults import raised


class EnvFailed(Exception):
    """The env failed while being evaluated; the message is one line, the env's own exception (if any) its cause."""


class CheckedEnvs(VectorWrapper):
    """`envs` with each reset and step checked. Env i of a round plays episode `first_episode + i` from seed
    `seed + i` (rl-eval's numbering); with `scored_only`, only those first episodes are checked, since the steps
    after an env's scored episode ends are not part of the evaluation."""

    def __init__(self, envs: VectorEnv, env_id: str, scored_only: bool = True) -> None:
        super().__init__(envs)
        self.env_id, self.scored_only = env_id, scored_only
        self.first_episode, self.seed = 0, 0
        self.steps = np.zeros(self.num_envs, dtype=np.int64)
        self.scoring = np.ones(self.num_envs, dtype=bool)  # still in the episode that this round scores

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None) -> Any:
        self.seed = seed if isinstance(seed, int) else 0
        self.steps[:] = 0
        self.scoring[:] = True
        try:
            obs, infos = self.env.reset(seed=seed, options=options)
        except Exception as error:
            raise EnvFailed(f"env {self.env_id} {raised(error)} at reset ({self._episodes()})") from error
        self._check(obs, None, "at reset")
        return obs, infos

    def step(self, actions: Any) -> Any:
        self.steps += 1
        try:
            obs, rewards, terminated, truncated, infos = self.env.step(actions)
        except Exception as error:
            raise EnvFailed(f"env {self.env_id} {raised(error)} at step {int(self.steps[self.scoring].max(initial=0))}"
                            f" of {self._episodes()}") from error
        self._check(obs, rewards, "")
        self.scoring &= ~np.logical_or(terminated, truncated)  # the step that ends an episode is still checked
        return obs, rewards, terminated, truncated, infos

    def _episodes(self) -> str:
        """The episodes this round is playing: `episode 3 (seed 3)`, or their range."""
        if not self.scored_only:
            return f"the check's {self.num_envs} envs (seeds {self.seed}-{self.seed + self.num_envs - 1})"
        rows = np.flatnonzero(self.scoring) if self.scoring.any() else np.arange(self.num_envs)
        first, last = int(rows[0]), int(rows[-1])
        if first == last:
            return self._episode(first)
        return (f"one of episodes {self.first_episode + first}-{self.first_episode + last} (seeds {self.seed + first}-"
                f"{self.seed + last})")

    def _episode(self, row: int) -> str:
        return f"episode {self.first_episode + row} (seed {self.seed + row})"

    def _check(self, obs: Any, rewards: Any, when: str) -> None:
        rows = self.scoring if self.scored_only else np.ones(self.num_envs, dtype=bool)
        values = obs.values() if isinstance(obs, dict) else [obs]
        for value in values:
            array = np.asarray(value)
            if array.dtype.kind == "c":
                raise EnvFailed(f"env {self.env_id} returned complex observations ({array.dtype}) "
                                f"{when or f'at step {int(self.steps.max())}'}; rlcli acts on real numbers")
            if array.dtype.kind == "f" and array.shape[:1] == (self.num_envs,):
                bad = np.flatnonzero(rows & ~np.isfinite(array.reshape(self.num_envs, -1)).all(axis=1))
                if len(bad):
                    row = int(bad[0])
                    where = when or f"at step {int(self.steps[row])}"
                    raise EnvFailed(f"env {self.env_id} returned a non-finite observation "
                                    f"({array[row].ravel()[:6].tolist()}) {where} of {self._episode(row)}")
        if rewards is not None:
            rewards = np.asarray(rewards)
            if rewards.dtype.kind in "fc":
                bad = np.flatnonzero(rows & ~np.isfinite(rewards))
                if len(bad):
                    row = int(bad[0])
                    raise EnvFailed(f"env {self.env_id} returned a non-finite reward ({rewards[row]}) at step "
                                    f"{int(self.steps[row])} of {self._episode(row)}")
