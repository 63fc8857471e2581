"""The collector of an offline run: the dataset is already in the replay storage, so a collect phase touches no env.

It reports `steps` loop steps per collect phase, each of which the algorithm's update turns into one gradient step
(RunClock.transitions = steps, which `algo.gradient_steps=-1` reads; an offline run's algorithm takes
`gradient_steps` of them): the trainer's clock, its budget and every cadence then count gradient steps, and the loop
stays collect -> update -> test / log / checkpoint, with no second trainer.
"""

from __future__ import annotations

from typing import Any

from rlcli.collectors.local import CollectStats, ExperienceCollector
from rlcli.contracts import Learner
from rlcli.services.timing import PhaseClock


class OfflineCollector:
    """The ExperienceCollector of a run with `dataset=` (collectors/local.py's Protocol): no env, no state."""

    def __init__(self, steps: int, description: str, clock: PhaseClock | None = None) -> None:
        self.steps = steps  # gradient steps per loop iteration (the algorithm's gradient_steps)
        self.description = description
        self.clock = clock or PhaseClock()

    def collect(self, learner: Learner, random_actions: bool = False) -> CollectStats:
        return CollectStats(steps=self.steps, transitions=self.steps)

    def reset(self, seed: int) -> None:
        """No training env to reset."""

    def state_dict(self) -> dict[str, object]:
        return {}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Nothing to restore: it keeps no state."""

    def env_state(self) -> Any:
        return None

    def restore_envs(self, state: Any) -> str | None:
        return None  # no training env: an offline resume is exact without one

    def describe(self) -> str:
        return self.description

    def close(self) -> None:
        """Nothing of its own."""


class FrozenNorm:
    """The networks' observation normalizer as an online collector sees it after an offline start with
    offline.normalize_obs: the dataset's statistics, applied and never updated."""

    def __init__(self, normalizer: Any) -> None:
        self.normalizer = normalizer

    def update(self, batch: Any) -> None:
        """Frozen: the statistics stay the dataset's."""

    def __call__(self, obs: Any) -> Any:
        return self.normalizer(obs)


class OfflineThenOnline:
    """offline.online_steps: the offline collector's gradient steps until `offline_steps` have been reported, then
    the ordinary collector stepping the training envs into the same storage (which mixes the dataset and the new
    experience, offline/replay.MixedReplay). Its count of reported steps is saved, so a resume switches at the
    same step."""

    def __init__(self, offline: OfflineCollector, online: ExperienceCollector, offline_steps: int) -> None:
        self.offline, self.online, self.offline_steps = offline, online, offline_steps
        self.clock = offline.clock
        self.reported = 0  # steps reported by the offline part

    @property
    def is_online(self) -> bool:
        return self.reported >= self.offline_steps

    def collect(self, learner: Learner, random_actions: bool = False) -> CollectStats:
        if self.is_online:
            return self.online.collect(learner, random_actions)
        stats = self.offline.collect(learner, random_actions)
        self.reported += stats.steps
        return stats

    def reset(self, seed: int) -> None:
        self.online.reset(seed)

    def state_dict(self) -> dict[str, object]:
        return {"reported": self.reported, "online": self.online.state_dict()}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.reported = int(state["reported"])  # type: ignore[call-overload]
        self.online.load_state_dict(state["online"])  # type: ignore[arg-type]

    def env_state(self) -> Any:
        return self.online.env_state()

    def restore_envs(self, state: Any) -> str | None:
        return self.online.restore_envs(state)

    def describe(self) -> str:
        return f"{self.offline.describe()}, then online"

    def close(self) -> None:
        self.online.close()
