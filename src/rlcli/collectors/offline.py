"""The collector of an offline run: the dataset is already in the replay storage, so a collect phase touches no env.

It reports `steps` loop steps per collect phase, each of which the algorithm's update turns into one gradient step
(RunClock.transitions = steps, which `algo.gradient_steps=-1` reads; an offline run's algorithm takes
`gradient_steps` of them): the trainer's clock, its budget and every cadence then count gradient steps, and the loop
stays collect -> update -> test / log / checkpoint, with no second trainer.
"""

from __future__ import annotations

from typing import Any

from rlcli.collectors.local import CollectStats
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
