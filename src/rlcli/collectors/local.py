"""Runs the policy in the training envs: `Collector.collect` fills a rollout or the replay (testing.py runs
the test phases, env_faults.py words what a failing env did).

Glossary (the words the trainer uses): an *env step* is one step of one sub-env; a *collect phase*
is n_steps steps of the whole vector env; an *update* is what the algorithm does with a full
buffer; a *test phase* runs the deterministic policy on separate envs for a number of episodes.
"""

from __future__ import annotations

import collections
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import numpy as np
import torch
from gymnasium.vector import VectorEnv

from rlcli.actors.normalizer import RunningNorm
from rlcli.collectors.env_faults import EnvError, check_env_output, env_name, raised, timed_out
from rlcli.contracts import (
    ActOutput,
    Learner,
    MaskedPolicy,
    OffPolicyLearner,
    OnPolicyLearner,
    RecurrentState,
    ReplayStorage,
    SequenceStorage,
)
from rlcli.envs import finished_episodes
from rlcli.envs.masks import mask_width, masks_from_infos
from rlcli.envs.multiagent import agent_returns, find_attr
from rlcli.envs.state import capturable, get_env_state, set_env_state
from rlcli.envs.turn_based import ACTING_KEY
from rlcli.registry import ConfigError
from rlcli.services.deadlines import DEADLINES, StepTimedOut
from rlcli.services.timing import PhaseClock


@dataclass
class CollectStats:
    steps: int
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
    episode_steps: list[int] = field(default_factory=list)  # the step of the phase at which each one finished
    transitions: int = 0  # steps that stored a transition: all but the reset step that follows an episode's end
    scalars: dict[str, float] = field(default_factory=dict)  # the collector's own figures (collector/*), logged
    agent_episodes: dict[str, list[float]] = field(default_factory=dict)  # env=pz: each agent's returns this phase


class AgentReturns:
    """env=pz: each agent's returns over the last 100 episodes, the window of rollout/return_mean (run/build.py's
    recent_returns), so the agents' means add up to the team's; and each group's (env.groups), its agents' sum."""

    def __init__(self, names: list[str], groups: dict[str, list[str]]) -> None:
        self.groups = groups
        self.recent = {name: collections.deque[float](maxlen=100) for name in names}

    def add(self, stats: CollectStats, returns: dict[str, list[float]]) -> None:
        """Episodes' returns per agent: into `stats.agent_episodes` (this phase's) and the windows, whose means
        become stats.scalars' rollout/return_<agent> and rollout/group_return_<group>."""
        for name, values in returns.items():
            if values:
                stats.agent_episodes.setdefault(name, []).extend(values)
                self.recent[name].extend(values)
                stats.scalars[f"rollout/return_{name}"] = float(np.mean(self.recent[name]))
        if len(self.groups) > 1:  # a group's return is its agents' sum; their windows hold the same episodes
            for group, names in self.groups.items():
                if all(self.recent[name] for name in names):
                    stats.scalars[f"rollout/group_return_{group}"] = float(
                        sum(np.mean(self.recent[name]) for name in names))

    def state_dict(self) -> dict[str, list[float]]:
        return {name: list(window) for name, window in self.recent.items()}

    def load_state_dict(self, recent: object) -> None:
        for name, window in self.recent.items():
            window.clear()
            if isinstance(recent, dict):
                window.extend(float(r) for r in recent.get(name, []))


class ExperienceCollector(Protocol):
    """What the trainer and the checkpoints call on a collector: `Collector` steps the envs in this process,
    `RayCollector` (ray_collector.py) on Ray workers. Both fill the buffer the same way."""

    clock: PhaseClock

    def collect(self, learner: Learner, random_actions: bool = False) -> CollectStats: ...

    def reset(self, seed: int) -> None:
        """Reset every training env (seeded like gymnasium's vector envs: env i gets seed + i)."""
        ...

    def state_dict(self) -> dict[str, object]: ...

    def load_state_dict(self, state: dict[str, object]) -> None: ...

    def env_state(self) -> Any:
        """The envs' state for an exact resume, or None when it cannot be captured."""
        ...

    def restore_envs(self, state: Any) -> str | None:
        """Put `env_state()`'s result back; or, when that cannot be done, say why in one line (the
        trainer then resets the envs and warns with it)."""
        ...

    def describe(self) -> str:
        """For the run's header line: where the envs step ('' for this process)."""
        ...

    def close(self) -> None: ...


class Collector:
    """Keeps the training envs' current observations (and a recurrent network's carry) between collect phases.

    Observations are normalized here, once, for acting (updating the running statistics); the rollout
    stores what acting saw, replay stores raw observations (its batches are normalized with the
    statistics of the moment they are sampled).
    """

    def __init__(self, envs: VectorEnv, normalizer: RunningNorm, device: torch.device, seed: int,
                 carry_size: int = 0, clock: PhaseClock | None = None,
                 obs_dtype: torch.dtype = torch.float32, masks: bool = False) -> None:
        self.envs, self.normalizer, self.device = envs, normalizer, device
        self.carry_size = carry_size  # > 0: a recurrent network
        self.masks = masks  # the algorithm acts on valid-action masks (AlgoSpec.action_masks)
        self.obs_dtype = obs_dtype  # uint8 for pixels: they stay uint8 until the network scales them
        self.clock = clock or PhaseClock()
        self.agent_names: list[str] = find_attr(envs, "agent_names") or []  # env=pz: the group's agents, by row
        self.agent_windows = AgentReturns(self.agent_names, find_attr(envs, "agent_groups") or {})
        self.act_s = self.env_s = self.buffer_s = 0.0  # this collect phase's seconds so far
        self.reset(seed)

    def reset(self, seed: int) -> None:
        try:
            obs, infos = self.envs.reset(seed=seed)
        except Exception as error:
            raise ConfigError(f"env {env_name(self.envs)} {raised(error)} at reset") from None
        space_shape = getattr(self.envs.observation_space, "shape", None)
        self._obs_shape = tuple(space_shape) if isinstance(obs, np.ndarray) and space_shape else None
        if self._obs_shape is not None and obs.shape != self._obs_shape:
            raise ConfigError(f"env {env_name(self.envs)} returned observations of shape {obs.shape} at reset; its "
                              f"observation space says {self._obs_shape} (the env's reset and its space disagree)")
        self.obs = torch.as_tensor(obs, dtype=self.obs_dtype, device=self.device)
        self.action_mask = self._masks(infos)  # the valid actions at the current observations
        self.acting = _acting(infos)  # a turn-based env: the rows that act at the current observations
        self.prev_done = np.zeros(self.envs.num_envs, dtype=bool)  # next step of these envs is a reset step
        # Recurrent networks: the carry between steps, and which envs begin an episode at the next step.
        self.carry: torch.Tensor | None = None
        self.episode_start = np.ones(self.envs.num_envs, dtype=bool)

    def state_dict(self) -> dict[str, object]:
        return {"obs": self.obs.cpu(), "prev_done": self.prev_done.copy(), "episode_start": self.episode_start.copy(),
                "carry": None if self.carry is None else self.carry.clone().cpu(),
                "action_mask": None if self.action_mask is None else self.action_mask.cpu(),
                **({"acting": self.acting.copy()} if self.acting is not None else {}),
                **({"recent_agent_returns": self.agent_windows.state_dict()} if self.agent_names else {})}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.obs = torch.as_tensor(state["obs"], device=self.device)
        self.prev_done = np.asarray(state["prev_done"]).copy()
        self.episode_start = np.asarray(state["episode_start"]).copy()
        carry = state["carry"]
        self.carry = None if carry is None else torch.as_tensor(carry, device=self.device).clone()
        mask = state.get("action_mask")
        self.action_mask = None if mask is None else torch.as_tensor(mask, device=self.device).clone()
        acting = state.get("acting")
        self.acting = None if acting is None else np.asarray(acting, dtype=bool).copy()
        self.agent_windows.load_state_dict(state.get("recent_agent_returns"))

    def env_state(self) -> Any:
        return get_env_state(self.envs) if capturable(self.envs) else None

    def restore_envs(self, state: Any) -> str | None:
        if state is not None and capturable(self.envs):
            set_env_state(self.envs, state)
            return None
        return ("the env state could not be saved or restored (e.g. async vector envs): the envs were "
                "reset, so this resume continues from fresh episodes rather than exactly")

    def describe(self) -> str:
        return ""

    def close(self) -> None:
        """Nothing of its own: the envs belong to the components, which close them."""

    def _masks(self, infos: dict[str, Any]) -> torch.Tensor | None:
        if not self.masks:
            return None
        width = mask_width(self.envs.single_action_space)
        return torch.as_tensor(masks_from_infos(infos, self.envs.num_envs, width), device=self.device)

    def recurrent_state(self) -> RecurrentState | None:
        if not self.carry_size:
            return None
        if self.carry is None:
            self.carry = torch.zeros(self.envs.num_envs, self.carry_size, device=self.device)
        starts = torch.as_tensor(self.episode_start, dtype=torch.float32, device=self.device)
        return RecurrentState(self.carry, starts)

    def collect(self, learner: Learner, random_actions: bool = False) -> CollectStats:
        """algo.steps_per_collect steps of every env into the learner's storage: a whole rollout, finished by its
        `finish_rollout` (on-policy), or transitions (off-policy; with `episodes_per_collect`, steps until that
        many episodes have ended). `random_actions`: the off-policy warm-up, uniformly random actions (a
        recurrent network still steps its carry)."""
        algo = learner.algo
        stats = self.begin(learner)
        for step in itertools.count():
            if self.collected_enough(learner, stats, step):
                break
            t0 = time.perf_counter()
            obs, state = self.observe()
            out = None
            if state is not None or not random_actions:  # random warm-up actions skip the policy's sampling
                mask = self.action_mask
                out = algo.act(obs, state=state) if mask is None else cast(MaskedPolicy, algo).act_masked(obs, mask)
            self.act_s += time.perf_counter() - t0
            self.advance(learner, stats, step, obs, state, out, random_actions)
        self.end(learner)
        return stats

    # collect's parts, which a population (sweeps/population/) calls for its members in step, acting for all at once
    def begin(self, learner: Learner) -> CollectStats:
        if isinstance(learner, OnPolicyLearner):
            learner.buffer.reset()
        self.act_s = self.env_s = self.buffer_s = 0.0
        return CollectStats(steps=learner.algo.steps_per_collect * self.envs.num_envs)

    def collected_enough(self, learner: Learner, stats: CollectStats, step: int) -> bool:
        """Whether the phase ends before `step`: after algo.steps_per_collect steps, or (off-policy, with
        `episodes_per_collect`) once that many episodes have ended; then its env steps are set in `stats`."""
        episodes = learner.algo.episodes_per_collect if isinstance(learner, OffPolicyLearner) else 0
        if not ((len(stats.episode_returns) >= episodes) if episodes else step >= learner.algo.steps_per_collect):
            return False
        stats.steps = step * self.envs.num_envs
        return True

    def observe(self) -> tuple[torch.Tensor, RecurrentState | None]:
        """The observations to act on, normalized (updating the running statistics), and a recurrent carry."""
        self.normalizer.update(self.obs)
        return self.normalizer(self.obs), self.recurrent_state()

    def advance(self, learner: Learner, stats: CollectStats, step: int, obs: torch.Tensor,
                state: RecurrentState | None, out: ActOutput | None, random_actions: bool,
                drawn: tuple[torch.Tensor, np.ndarray] | None = None) -> None:
        """Step the envs with the acting's output (or random actions) and store the transition. `drawn`: the
        actions and their env form, when the caller already has them (a population moves all its members' env
        actions to the host at once: one wait for the GPU per step, not one per member)."""
        clock = time.perf_counter
        t0 = clock()
        n_envs = self.envs.num_envs
        if out is not None:
            self.carry = out.carry
        if drawn is not None:
            actions, env_actions = drawn
        else:
            actions = self.actions_to_take(learner, out, random_actions)
            env_actions = learner.algo.env_actions(actions).cpu().numpy()
        t1 = clock()
        try:  # train.step_timeout: DEADLINES ends a step that runs past it (services/deadlines.py)
            next_obs, rewards, terminated, truncated, infos = DEADLINES.call_within_step_deadline(
                self.envs.step, env_actions)
        except StepTimedOut as late:
            raise EnvError(timed_out(late.seconds), step * n_envs) from None
        except Exception as error:  # the env's own failure, named in one line by the trainer
            raise EnvError(raised(error), step * n_envs) from error
        check_env_output(next_obs, rewards, self._obs_shape, step * n_envs)
        t2 = clock()
        done = np.logical_or(terminated, truncated)
        valid = ~self.prev_done
        if isinstance(learner, OnPolicyLearner):
            assert out is not None
            recurrent = [] if state is None else [state.starts, state.carry]  # what this step began with
            masks: dict[str, Any] = {} if self.action_mask is None else {"action_mask": self.action_mask}
            if self.acting is not None:  # a turn-based env: a waiting row stores nothing (buffers/rollout.py's GAE)
                if state is not None or not hasattr(learner.buffer, "acting"):
                    raise ConfigError(f"env {env_name(self.envs)} is turn-based, which recurrent actors do not "
                                      "take yet: use actor=mlp")
                valid = valid & self.acting
                masks["acting"] = self.acting
            learner.buffer.add(obs, out.actions, out.log_probs, out.values, rewards, terminated, done,
                               valid, *recurrent, **masks)
        elif self.acting is not None:
            raise ConfigError(f"env {env_name(self.envs)} is turn-based: its players' transitions span the other "
                              f"players' moves, which only on-policy algorithms store; use algo=maskable_ppo or ppo")
        else:
            transition = (self.obs, actions, rewards, next_obs, terminated, done, ~self.prev_done)
            if state is None:
                cast(ReplayStorage, learner.buffer).add(*transition)
            else:  # recurrent networks learn from sequences (the build pairs them with buffer=sequence)
                cast(SequenceStorage, learner.buffer).add(*transition, state.starts, state.carry)
        stats.transitions += int(valid.sum())
        returns, lengths = finished_episodes(infos)
        stats.episode_returns.extend(returns.tolist())
        stats.episode_lengths.extend(lengths.tolist())
        stats.episode_steps.extend([step] * len(returns))
        if self.agent_names:  # env=pz: each agent's return, next to the team sums above (envs/multiagent.py)
            self.agent_windows.add(stats, agent_returns(infos, self.agent_names))
        self.obs = torch.as_tensor(next_obs, dtype=self.obs_dtype, device=self.device)
        self.action_mask = self._masks(infos)
        self.acting = _acting(infos)
        self.episode_start = self.prev_done.copy()  # after a reset step comes a new episode's first step
        self.prev_done = done
        t3 = clock()
        self.act_s += t1 - t0
        self.env_s += t2 - t1
        self.buffer_s += t3 - t2

    def actions_to_take(self, learner: Learner, out: ActOutput | None, random_actions: bool) -> torch.Tensor:
        """The acting's actions, or (an off-policy warm-up) uniformly random ones, drawn from torch's generator so
        that a resume stays exact."""
        if out is not None and not random_actions:
            return out.actions
        assert isinstance(learner, OffPolicyLearner), "only off-policy runs warm up with random actions"
        return learner.algo.random_actions(self.envs.num_envs).to(self.device)

    def end(self, learner: Learner) -> None:
        """Finish an on-policy rollout (its returns and advantages), and account the phase's time."""
        if isinstance(learner, OnPolicyLearner):
            t0 = time.perf_counter()
            if self.acting is not None:  # a turn-based env: who acts at the observations the rollout ends on
                cast(Any, learner.buffer).last_acting = torch.as_tensor(self.acting, device=self.device)
            learner.algo.finish_rollout(learner.buffer, self.normalizer(self.obs), self.recurrent_state())
            self.buffer_s += time.perf_counter() - t0
        self._account(self.act_s, self.env_s, self.buffer_s)

    def _account(self, act_s: float, env_s: float, buffer_s: float) -> None:
        seconds = self.clock.seconds
        seconds["act"] += act_s
        seconds["env"] += env_s
        seconds["buffer"] += buffer_s


def _acting(infos: dict[str, Any]) -> np.ndarray | None:
    """A turn-based env's `info["rlcli_acting"]` (envs/turn_based.py): the rows that act at the observations it
    returned."""
    acting = infos.get(ACTING_KEY)
    return None if acting is None else np.asarray(acting, dtype=bool).copy()
