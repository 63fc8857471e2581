"""SlowCartPole-v1: CartPole whose every step also takes `step_ms` milliseconds, standing in for a slow
simulator when measuring collectors (scripts/bench_collector.py).

`work="spin"` burns the time on the CPU, as a simulator does, so collection saturates with the cores;
`work="sleep"` waits without using the CPU, as an env waiting on I/O or another machine does.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class SlowCartPoleEnv(CartPoleEnv):
    def __init__(self, step_ms: float = 1.0, work: str = "spin", **kwargs: Any) -> None:
        if work not in ("spin", "sleep"):
            raise ValueError(f"work={work!r} is invalid; choose from: spin, sleep")
        if step_ms < 0:
            raise ValueError(f"step_ms={step_ms!r} is invalid: must be >= 0")
        super().__init__(**kwargs)
        self.step_seconds, self.work = step_ms / 1000.0, work

    def step(self, action: Any) -> Any:
        if self.work == "sleep":
            time.sleep(self.step_seconds)
        else:
            end = time.perf_counter() + self.step_seconds
            while time.perf_counter() < end:
                pass
        return super().step(action)


gym.register("SlowCartPole-v1", entry_point=SlowCartPoleEnv, max_episode_steps=500, reward_threshold=475.0)
