"""Runs the policy in vector envs: `Collector.collect` fills a rollout, `evaluate` tests.

Glossary (the words the trainer uses): an *env step* is one step of one sub-env; a *collect phase*
is n_steps steps of the whole vector env; an *update* is what the algorithm does with a full
buffer; a *test phase* runs the deterministic policy on separate envs for a number of episodes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from gymnasium.vector import VectorEnv

from rlcli.actors.normalizer import RunningNorm
from rlcli.algos.base import Algorithm
from rlcli.buffers.replay import ReplayBuffer
from rlcli.buffers.rollout import RolloutBuffer
from rlcli.envs import finished_episodes
from rlcli.timing import PhaseClock


@dataclass
class CollectStats:
    steps: int
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)


@dataclass
class TestStats:
    returns: np.ndarray
    lengths: np.ndarray

    @property
    def mean_return(self) -> float:
        return float(self.returns.mean())


class Collector:
    """Keeps the training envs' current observations between collect phases."""

    def __init__(self, envs: VectorEnv, normalizer: RunningNorm, device: torch.device, seed: int,
                 clock: PhaseClock | None = None, obs_dtype: torch.dtype = torch.float32) -> None:
        self.envs, self.normalizer, self.device = envs, normalizer, device
        self.obs_dtype = obs_dtype  # uint8 for pixels: they stay uint8 until the network scales them
        self.clock = clock or PhaseClock()
        self.reset(seed)

    def reset(self, seed: int) -> None:
        obs, _ = self.envs.reset(seed=seed)
        self.obs = torch.as_tensor(obs, dtype=self.obs_dtype, device=self.device)
        self.prev_done = np.zeros(self.envs.num_envs, dtype=bool)  # next step of these envs is a reset step
        # Recurrent actors: the carry between steps, and which envs begin an episode at the next step.
        self.carry: torch.Tensor | None = None
        self.episode_start = np.ones(self.envs.num_envs, dtype=bool)

    def state_dict(self) -> dict[str, object]:
        return {"obs": self.obs.cpu(), "prev_done": self.prev_done.copy(), "episode_start": self.episode_start.copy(),
                "carry": None if self.carry is None else self.carry.clone().cpu()}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.obs = torch.as_tensor(state["obs"], device=self.device)
        self.prev_done = np.asarray(state["prev_done"]).copy()
        self.episode_start = np.asarray(state.get("episode_start", self.episode_start)).copy()
        carry = state.get("carry")
        self.carry = None if carry is None else torch.as_tensor(carry, device=self.device).clone()

    def collect(self, algo: Algorithm, buffer: Any, random_actions: bool = False) -> CollectStats:
        """n_steps of every env into `buffer`: a whole rollout (on-policy) or transitions (off-policy)."""
        if algo.on_policy:
            return self._collect_rollout(algo, buffer)
        return self._collect_transitions(algo, buffer, random_actions)

    def _collect_transitions(self, algo: Any, buffer: ReplayBuffer, random_actions: bool) -> CollectStats:
        """Replay stores raw observations; algorithms normalize sampled batches with the current statistics."""
        stats = CollectStats(steps=algo.n_steps * self.envs.num_envs)
        clock = time.perf_counter
        act_s = env_s = buffer_s = 0.0
        actor = algo.actor
        recurrent = getattr(actor, "recurrent", False)  # R2D2: sequences with the carry they began with
        if recurrent and self.carry is None:
            self.carry = actor.initial_carry(self.envs.num_envs, self.device)
        sequence_args: tuple[torch.Tensor, ...] = ()
        for _ in range(algo.n_steps):
            t0 = clock()
            self.normalizer.update(self.obs)
            if recurrent:  # the Q-network reads and advances the carry even when the action is random
                starts = torch.as_tensor(self.episode_start, dtype=torch.float32, device=self.device)
                sequence_args = (starts, self.carry)
                actor.carry, actor.starts = self.carry, starts
                actions = algo.act(self.normalizer(self.obs)).actions
                self.carry = actor.carry
            if random_actions:  # before learning_starts; torch's generator keeps resume exact
                actions = algo.random_actions(self.envs.num_envs).to(self.device)
            elif not recurrent:
                actions = algo.act(self.normalizer(self.obs)).actions
            env_actions = algo.env_actions(actions)
            t1 = clock()
            next_obs, rewards, terminated, truncated, infos = self.envs.step(env_actions)
            t2 = clock()
            done = np.logical_or(terminated, truncated)
            buffer.add(self.obs, actions, rewards, next_obs, terminated, done, ~self.prev_done, *sequence_args)
            returns, lengths = finished_episodes(infos)
            stats.episode_returns.extend(returns.tolist())
            stats.episode_lengths.extend(lengths.tolist())
            self.obs = torch.as_tensor(next_obs, dtype=self.obs_dtype, device=self.device)
            self.episode_start = self.prev_done.copy()  # after a reset step comes a new episode's first step
            self.prev_done = done
            t3 = clock()
            act_s, env_s, buffer_s = act_s + (t1 - t0), env_s + (t2 - t1), buffer_s + (t3 - t2)
        self._account(act_s, env_s, buffer_s)
        return stats

    def _collect_rollout(self, algo: Algorithm, buffer: RolloutBuffer) -> CollectStats:
        """Fill `buffer` with n_steps of every env, then compute its advantages and returns."""
        buffer.reset()
        stats = CollectStats(steps=buffer.n_steps * self.envs.num_envs)
        to_tensor = lambda x: torch.as_tensor(x, dtype=torch.float32, device=self.device)  # noqa: E731
        clock = time.perf_counter
        act_s = env_s = buffer_s = 0.0
        actor = algo.actor
        recurrent = getattr(actor, "recurrent", False)
        if recurrent and self.carry is None:
            self.carry = actor.initial_carry(self.envs.num_envs, self.device)
        starts = carry = None
        for _ in range(buffer.n_steps):
            t0 = clock()
            self.normalizer.update(self.obs)
            obs = self.normalizer(self.obs)
            if recurrent:  # the actor reads and advances the carry, zeroed where an episode starts
                starts, carry = to_tensor(self.episode_start), self.carry
                actor.carry, actor.starts = carry, starts
            out = algo.act(obs)
            if recurrent:
                self.carry = actor.carry
            env_actions = algo.env_actions(out.actions)
            t1 = clock()
            next_obs, rewards, terminated, truncated, infos = self.envs.step(env_actions)
            t2 = clock()
            done = np.logical_or(terminated, truncated)
            buffer.add(
                obs, out.actions, out.log_probs, out.values, to_tensor(rewards), to_tensor(terminated),
                to_tensor(done), to_tensor(~self.prev_done), *((starts, carry) if recurrent else ()),
            )
            returns, lengths = finished_episodes(infos)
            stats.episode_returns.extend(returns.tolist())
            stats.episode_lengths.extend(lengths.tolist())
            self.obs = torch.as_tensor(next_obs, dtype=self.obs_dtype, device=self.device)
            self.episode_start = self.prev_done.copy()  # after a reset step comes a new episode's first step
            self.prev_done = done
            t3 = clock()
            act_s, env_s, buffer_s = act_s + (t1 - t0), env_s + (t2 - t1), buffer_s + (t3 - t2)
        t0 = clock()
        if recurrent:
            actor.carry, actor.starts = self.carry, to_tensor(self.episode_start)
        last_obs = self.normalizer(self.obs)
        finish = getattr(algo, "finish_rollout", None)
        if finish is not None:  # the algorithm computes its own returns (rnd_ppo: intrinsic rewards too)
            finish(buffer, last_obs)
        else:
            with torch.inference_mode():
                value = getattr(algo, "value", algo.actor.value)  # an algorithm may define its own baseline
                last_values = value(last_obs)
            buffer.compute_returns(last_values, algo.gamma, algo.gae_lambda)
        self._account(act_s, env_s, buffer_s + clock() - t0)
        return stats

    def _account(self, act_s: float, env_s: float, buffer_s: float) -> None:
        seconds = self.clock.seconds
        seconds["act"] += act_s
        seconds["env"] += env_s
        seconds["buffer"] += buffer_s


def evaluate(envs: VectorEnv, algo: Algorithm, normalizer: RunningNorm, device: torch.device, seed: int,
             obs_dtype: torch.dtype = torch.float32) -> TestStats:
    """One episode in each test env with the deterministic policy and frozen normalization."""
    n = envs.num_envs
    returns, lengths = np.zeros(n), np.zeros(n, dtype=np.int64)
    finished = np.zeros(n, dtype=bool)
    obs, _ = envs.reset(seed=seed)
    actor = algo.actor
    recurrent = getattr(actor, "recurrent", False)
    if recurrent:  # one episode per env: a fresh carry at the first step, never reset after it
        actor.carry = actor.initial_carry(n, device)
        actor.starts = torch.ones(n, device=device)
    while not finished.all():
        with torch.inference_mode():
            x = normalizer(torch.as_tensor(obs, dtype=obs_dtype, device=device))
            actions = algo.act(x, deterministic=True).actions
        if recurrent:
            actor.starts = torch.zeros(n, device=device)
        obs, _, _, _, infos = envs.step(algo.env_actions(actions))
        if "_episode" in infos:
            first = infos["_episode"] & ~finished
            returns[first] = infos["episode"]["r"][first]
            lengths[first] = infos["episode"]["l"][first]
            finished |= first
    return TestStats(returns, lengths)
