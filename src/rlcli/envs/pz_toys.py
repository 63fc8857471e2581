"""Small PettingZoo Parallel envs for tests and examples of env=pz (conf/env/coop_match.yaml).

`coop_match`: a cooperative two-agent task that needs the agents to specialise (a shared network learns it only with
the agent one-hot, env.agent_id=true); `coop_reach` the same with continuous actions. `gym_copies`: N independent
copies of a single-agent gymnasium env, one per agent, which a shared-parameter IPPO run must learn exactly as a
single-agent run with N times the envs.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from pettingzoo import ParallelEnv


class CoopMatch(ParallelEnv):  # type: ignore[misc]
    """Each step both agents see the same cue c in {0, 1, 2}; both get 1 when agent_0 says c and agent_1 says
    c + 1 (mod 3), else 0. `leave_at`: agent_1 terminates after that many steps (an agent that leaves early)."""

    metadata = {"name": "coop_match_v0", "render_modes": []}

    def __init__(self, max_cycles: int = 10, leave_at: int | None = None) -> None:
        self.possible_agents = ["agent_0", "agent_1"]
        self.agents: list[str] = []
        self.max_cycles, self.leave_at = max_cycles, leave_at
        self.np_random = np.random.default_rng()
        self.cue, self.t = 0, 0
        self._obs_space = gym.spaces.Box(0.0, 1.0, (3,), np.float32)
        self._act_space = gym.spaces.Discrete(3)
        self.state_space = gym.spaces.Box(0.0, 1.0, (4,), np.float32)

    def observation_space(self, agent: str) -> gym.spaces.Space[Any]:
        return self._obs_space

    def action_space(self, agent: str) -> gym.spaces.Space[Any]:
        return self._act_space

    def _observations(self) -> dict[str, np.ndarray]:
        one_hot = np.eye(3, dtype=np.float32)[self.cue]
        return {a: one_hot.copy() for a in self.agents}

    def state(self) -> np.ndarray:
        return np.append(np.eye(3, dtype=np.float32)[self.cue], np.float32(self.t / self.max_cycles))

    def reset(self, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        if seed is not None:
            self.np_random = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self.t, self.cue = 0, int(self.np_random.integers(3))
        return self._observations(), {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict[str, Any], ...]:
        hit = (int(actions.get("agent_0", -1)) == self.cue
               and ("agent_1" not in self.agents or int(actions["agent_1"]) == (self.cue + 1) % 3))
        rewards = {a: float(hit) for a in self.agents}
        self.t += 1
        self.cue = int(self.np_random.integers(3))
        truncations = {a: self.t >= self.max_cycles for a in self.agents}
        terminations = {a: a == "agent_1" and self.leave_at is not None and self.t >= self.leave_at
                        for a in self.agents}
        obs = self._observations()
        infos: dict[str, dict[str, Any]] = {a: {} for a in self.agents}
        self.agents = [a for a in self.agents if not (terminations[a] or truncations[a])]
        return obs, rewards, terminations, truncations, infos


def coop_match(**kwargs: Any) -> CoopMatch:
    """env=pz env.id=rlcli.envs.pz_toys:coop_match."""
    return CoopMatch(**kwargs)


parallel_env = coop_match


class CoopReach(ParallelEnv):  # type: ignore[misc]
    """Continuous actions: each step both agents see the same cue c in [-1, 1]; both get
    -((a_0 - c)^2 + (a_1 + c)^2), so agent_0 must say c and agent_1 its opposite (a shared network tells them apart
    by the agent one-hot). A 10-step episode's team return (both agents' rewards) is 0 at best, about -26.6 at
    random."""

    metadata = {"name": "coop_reach_v0", "render_modes": []}

    def __init__(self, max_cycles: int = 10) -> None:
        self.possible_agents = ["agent_0", "agent_1"]
        self.agents: list[str] = []
        self.max_cycles = max_cycles
        self.np_random = np.random.default_rng()
        self.cue, self.t = 0.0, 0
        self._obs_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self._act_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.state_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def observation_space(self, agent: str) -> gym.spaces.Space[Any]:
        return self._obs_space

    def action_space(self, agent: str) -> gym.spaces.Space[Any]:
        return self._act_space

    def _observations(self) -> dict[str, np.ndarray]:
        return {a: np.array([self.cue], np.float32) for a in self.agents}

    def state(self) -> np.ndarray:
        return np.array([self.cue, self.t / self.max_cycles], np.float32)

    def reset(self, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        if seed is not None:
            self.np_random = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self.t, self.cue = 0, float(self.np_random.uniform(-1.0, 1.0))
        return self._observations(), {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict[str, Any], ...]:
        a0, a1 = (float(np.asarray(actions[a]).reshape(-1)[0]) for a in self.possible_agents)
        reward = -((a0 - self.cue) ** 2 + (a1 + self.cue) ** 2)
        rewards = {a: reward for a in self.agents}
        self.t += 1
        self.cue = float(self.np_random.uniform(-1.0, 1.0))
        truncations = {a: self.t >= self.max_cycles for a in self.agents}
        terminations = {a: False for a in self.agents}
        obs = self._observations()
        infos: dict[str, dict[str, Any]] = {a: {} for a in self.agents}
        self.agents = [a for a in self.agents if not truncations[a]]
        return obs, rewards, terminations, truncations, infos


def coop_reach(**kwargs: Any) -> CoopReach:
    """env=coop_reach (env=pz env.id=rlcli.envs.pz_toys:coop_reach): continuous actions, for algo=masac, maddpg."""
    return CoopReach(**kwargs)


class GymCopies(ParallelEnv):  # type: ignore[misc]
    """`agents` independent copies of a gymnasium env, agent i in its own copy; reset(seed=s) seeds agent i's
    copy with s + i. Each agent's episode ends with its own copy's."""

    metadata = {"name": "gym_copies_v0", "render_modes": []}

    def __init__(self, env_id: str = "Pendulum-v1", agents: int = 2, max_episode_steps: int | None = None) -> None:
        self.possible_agents = [f"agent_{i}" for i in range(agents)]
        self.agents: list[str] = []
        self.gym_envs = [gym.make(env_id, max_episode_steps=max_episode_steps) for _ in range(agents)]

    def observation_space(self, agent: str) -> gym.spaces.Space[Any]:
        return self.gym_envs[0].observation_space

    def action_space(self, agent: str) -> gym.spaces.Space[Any]:
        return self.gym_envs[0].action_space

    def reset(self, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        self.agents = list(self.possible_agents)
        obs = {a: env.reset(seed=None if seed is None else seed + i)[0]
               for i, (a, env) in enumerate(zip(self.possible_agents, self.gym_envs, strict=True))}
        return obs, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict[str, Any], ...]:
        obs: dict[str, Any] = {}
        rewards: dict[str, Any] = {}
        terms: dict[str, Any] = {}
        truncs: dict[str, Any] = {}
        for i, a in enumerate(self.possible_agents):
            if a in self.agents:
                obs[a], rewards[a], terms[a], truncs[a], _ = self.gym_envs[i].step(actions[a])
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, {a: {} for a in obs}

    def close(self) -> None:
        for env in self.gym_envs:
            env.close()


def gym_copies(**kwargs: Any) -> GymCopies:
    """env=pz env.id=rlcli.envs.pz_toys:gym_copies env.kwargs.env_id=Pendulum-v1 env.kwargs.agents=2."""
    return GymCopies(**kwargs)
