"""PettingZoo Parallel envs as one gymnasium VectorEnv with a row per agent (`env=pz`).

M copies of an env with N agents in its group become M * N rows, copy c's agent i at row c * N + i, so the
on-policy collector, rollout buffer and PPO run unchanged with the agents as a batch dimension and one set of
parameters shared by the group (IPPO; MAPPO with `critic_state`, which appends the global state to every row for
the value network alone: actors/mlp.py reads `CentralizedObs.policy_size`). The layout is AgentRowsEnv's, which
env=vmas (envs/vmas.py: VMAS's batched copies) shares.

Episodes follow gymnasium's NEXT_STEP autoreset, per copy: an agent that PettingZoo ends (terminated or truncated)
reports that flag on its row at that step and on every later step of the copy, so the collector treats those steps
as reset steps and stores nothing from them; once every agent of the group is done, the copy's next step is its
reset step. A copy's episode is one episode: its return is the team sum over the group's agents (never divided),
reported on the copy's first row (`episode_rows`), with each agent's own return under `agent_episode` and the sum
over every agent of the env, those outside the group (`env.agents`) too, under `team_episode`.

Joint mode (`env.joint=true`, set by algo=vdn, qmix, masac and maddpg): one row per copy, for value decomposition
and centralized critics, whose replay needs each copy's agents in one transition. A row's observation is a Box
[n_agents, agent_size + 1 + state_size]: agent i's line is `[own obs | one-hot index (env.agent_id) | active |
global state]`, where `active` is 0 once the agent ended by termination, or on the step after it ended by truncation
while its copy goes on (it then acts no more: its actions are ignored and a learner masks its values out), and the
global state is env.state() (or, where the env has none, every agent's observation) repeated on each line. The
action is MultiDiscrete (`JointActions`, which names that layout), or for continuous actions a Box [n_agents,
action] (`JointBox`, naming it too), the reward the team sum over the group's agents, and the copy's episode ends
when every agent's has: it is `terminated` when no agent is active in the final observation (nothing to bootstrap
from), else `truncated`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from rlcli.envs.masks import MASK_KEY
from rlcli.envs.turn_based import TurnBasedVectorEnv, is_turn_based
from rlcli.registry import ENVS, ConfigError, did_you_mean, require


class CentralizedObs(gym.spaces.Box):
    """A row's observation `[own obs | agent one-hot | global state]`: the policy reads the first `policy_size`
    entries, the value network all of them (MAPPO's centralized critic)."""

    def __init__(self, low: np.ndarray, high: np.ndarray, policy_size: int) -> None:
        super().__init__(low, high, dtype=np.float32)
        self.policy_size = policy_size


class JointActions(gym.spaces.MultiDiscrete):
    """Joint mode's action space, one Discrete(n) action per agent of the group; it names the observation's layout
    (module docstring): each agent's line is `agent_size` inputs of its own, then its `active` flag, then `state_size`
    inputs of global state, within `state_low` and `state_high` (infinite where the env names no bound)."""

    def __init__(self, n_actions: int, n_agents: int, agent_size: int, state_size: int,
                 state_bounds: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        super().__init__(np.full(n_agents, n_actions, np.int64))
        self.n_actions, self.n_agents, self.agent_size, self.state_size = n_actions, n_agents, agent_size, state_size
        self.state_low, self.state_high = state_bounds or (np.full(state_size, -np.inf, np.float32),
                                                           np.full(state_size, np.inf, np.float32))


class JointBox(gym.spaces.Box):
    """Joint mode's action space for continuous actions: a Box [agents, action] of each agent's bounds; it names the
    observation's layout as JointActions does (algo=masac, maddpg)."""

    def __init__(self, space: gym.spaces.Box, n_agents: int, agent_size: int, state_size: int) -> None:
        low = np.broadcast_to(np.asarray(space.low, np.float32).reshape(-1), (n_agents, int(np.prod(space.shape))))
        high = np.broadcast_to(np.asarray(space.high, np.float32).reshape(-1), low.shape)
        super().__init__(low.copy(), high.copy(), dtype=np.float32)
        self.action_dim, self.n_agents = low.shape[1], n_agents
        self.agent_size, self.state_size = agent_size, state_size


@dataclass(frozen=True)
class SeparateAgents:
    """More than one set of parameters among the learning agents (actors/per_agent.py): each agent its own
    (env.share_params=false, `copy_of` None), or one per group of agents (env.groups: agent i uses copy `copy_of[i]`).
    Row mode reads a row's agent from its one-hot, the observation's columns from `id_start`; joint mode
    (`id_start` None) from the agent axis. The env puts it on its observation space as `separate_agents`."""

    n_agents: int
    id_start: int | None
    joint: bool
    copy_of: tuple[int, ...] | None = None

    @property
    def copies(self) -> int:
        """How many sets of parameters: one per agent, or one per group."""
        return self.n_agents if self.copy_of is None else max(self.copy_of) + 1


@dataclass(frozen=True)
class AgentGroups:
    """env.groups as the rows see it, for algo.groups (algos/grouped.py: each group its own algorithm): the groups'
    names, each learning agent's group (`group_of[i]`, by its one-hot from column `id_start`) and, per group, whether
    its agents each have their own network ({agents: [...], share_params: false}, or env.share_params=false). The env
    puts it on its observation space as `group_layout` (row mode, env.agent_id=true)."""

    names: tuple[str, ...]
    group_of: tuple[int, ...]
    separate: tuple[bool, ...]
    id_start: int

    @property
    def n_agents(self) -> int:
        return len(self.group_of)

    def agents_of(self, group: int) -> tuple[int, ...]:
        """The agents of group `group`, in row order."""
        return tuple(i for i, g in enumerate(self.group_of) if g == group)


@dataclass(frozen=True)
class ParallelEnvSpec:
    """What the rest of rlcli reads of an env's spec (its id, for messages and run names)."""

    id: str
    entry_point: str
    reward_threshold: float | None = None


def _no_such_module(env_id: str, module_name: str) -> None:
    """One line for `env.id=mpe2.simple_sprad_v3` (a module its installed package lacks): its modules, the nearest
    first, not the install advice a missing package gets."""
    import pkgutil

    parent, _, leaf = module_name.rpartition(".")
    try:
        package = importlib.import_module(parent)
    except ImportError:
        return
    if not hasattr(package, "__path__"):
        return
    names = sorted(m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_"))
    raise ConfigError(f"env.id={env_id!r}: {parent} has no module '{leaf}'{did_you_mean(leaf, names)}; its modules: "
                      f"{', '.join(names)}")


def resolve_parallel_env(env_id: str | None) -> Any:
    """`package.module` (its `parallel_env`, else its AEC `env`) or `package.module:function` -> a function that makes
    the env."""
    if not env_id:
        raise ConfigError("env.id is not set; use env=<shipped multi-agent env> or env=pz env.id=<module> "
                          "(e.g. mpe2.simple_spread_v3, or module:function for your own ParallelEnv)")
    module_name, _, attr = env_id.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        parts, missing = module_name.split("."), str(getattr(error, "name", "") or "")
        if missing == module_name and len(parts) > 1:  # the package is there, the module is not: a typo
            _no_such_module(env_id, module_name)
        hint = " (pip install -e '.[multiagent]')" if parts[0] in ("pettingzoo", "mpe2") else ""
        if parts[0] == "pettingzoo" and len(parts) > 1 and missing and not missing.startswith("pettingzoo"):
            hint = f" (PettingZoo's {parts[1]} envs need their extra: pip install 'pettingzoo[{parts[1]}]')"
        raise ConfigError(f"env.id={env_id!r}: cannot import module '{module_name}' ({error}){hint}") from None
    if attr:
        fn = getattr(module, attr, None)
        if fn is None:
            raise ConfigError(f"env.id={env_id!r}: module '{module_name}' has no '{attr}'")
        return fn
    fn = getattr(module, "parallel_env", None) or getattr(module, "env", None)  # env(): an AEC (turn-based) env
    if fn is None:
        raise ConfigError(f"env.id={env_id!r}: module '{module_name}' has neither parallel_env() nor env(); env=pz "
                          "takes PettingZoo Parallel or AEC envs (module:function for a function that makes one)")
    return fn


def pettingzoo_kind(env_id: str) -> str | None:
    """"Parallel" where `env_id` names a PettingZoo Parallel env's maker (a module with parallel_env(), or
    module:function where module has that function), "AEC (turn-based)" where it names a PettingZoo module with only
    the AEC env (env() and raw_env(), PettingZoo's layout: pettingzoo.classic.tictactoe_v3), else None (also where it
    does not import)."""
    module_name, _, attr = env_id.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception:  # noqa: BLE001  (not a module at all: a gymnasium id, which resolve_env_id words)
        return None
    if callable(getattr(module, attr or "parallel_env", None)):
        return "Parallel"
    if not attr and callable(getattr(module, "env", None)) and callable(getattr(module, "raw_env", None)):
        return "AEC (turn-based)"
    return None


def _is_parallel(env: Any) -> bool:
    from pettingzoo import AECEnv, ParallelEnv

    if isinstance(env, AECEnv) or hasattr(env, "agent_selection"):
        return False
    return isinstance(env, ParallelEnv) or (hasattr(env, "possible_agents") and hasattr(env, "step"))


class ObservationLayout:
    """How one agent's observation becomes the numbers of its row: a Box as it is (flattened); a Dict's
    'action_mask' entry taken out as the agent's valid actions; what is left (one entry, or a Dict, Discrete, Tuple,
    ...) flattened as gymnasium flattens it (a Discrete one-hot, a Dict's entries in its key order)."""

    def __init__(self, space: gym.spaces.Space[Any], name: str, env_id: str) -> None:
        self.space, self.name = space, name
        self.mask_in_obs = isinstance(space, gym.spaces.Dict) and MASK_KEY in space.spaces
        rest: gym.spaces.Space[Any] = space
        if self.mask_in_obs:
            assert isinstance(space, gym.spaces.Dict)
            entries = {k: v for k, v in space.spaces.items() if k != MASK_KEY}
            rest = next(iter(entries.values())) if len(entries) == 1 else gym.spaces.Dict(entries)
        self.rest = rest
        try:
            flat = rest if isinstance(rest, gym.spaces.Box) else gym.spaces.flatten_space(rest)
        except NotImplementedError:
            flat = None
        if not isinstance(flat, gym.spaces.Box):
            raise ConfigError(f"env {env_id}: agent {name!r} has {space} observations, which do not flatten into a "
                              "vector; multi-agent envs take Box, Discrete, MultiDiscrete and Dict/Tuple of them")
        self.flat = flat
        self.size = int(np.prod(flat.shape))

    def split(self, obs: Any) -> tuple[np.ndarray, np.ndarray | None]:
        """The agent's observation as a float32 vector of `size`, and its mask where the observation holds one."""
        mask = None
        if self.mask_in_obs:
            mask = np.asarray(obs[MASK_KEY], bool).reshape(-1)
            entries = {k: v for k, v in obs.items() if k != MASK_KEY}
            obs = next(iter(entries.values())) if len(entries) == 1 else entries
        if isinstance(self.rest, gym.spaces.Box):
            return np.asarray(obs, np.float32).reshape(-1), mask
        return np.asarray(gym.spaces.flatten(self.rest, obs), np.float32).reshape(-1), mask


class AgentRowsEnv(VectorEnv):
    """The layout of a multi-agent env's M copies as rows (module docstring), shared by env=pz (ParallelVectorEnv:
    PettingZoo copies, stepped one by one) and env=vmas (envs/vmas.py: VMAS's copies, one batched torch env): the
    spaces, the observation buffer `_obs` [copies, agents, size] and the episode counters, and a step's outputs and
    infos from [copies, agents] arrays (`_outputs`). A subclass writes agent i's own observation into
    `_obs[:, i, :own_sizes[i]]` (the rest of `own_size`, the largest, stays 0) and the global state into
    `_obs[..., -state_size:]`, keeps `_active`, `_returns`, `_other_returns` and `_lengths`, and returns
    `_outputs(...)` from its step."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def _init_layout(self, env_id: str, kind: str, possible: list[str], agents: list[str] | None,
                     observation_space: Any, action_space: Any, num_copies: int, agent_id: bool, critic_state: bool,
                     joint: bool, state_size: int, info_masks: bool = False,
                     state_bounds: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """The group (`agents`, default every one of `possible`) and its spaces (`observation_space(name)`,
        `action_space(name)`, gymnasium spaces) checked, then the layout's spaces and buffers; `kind` names the env
        kind in messages (env=pz); `info_masks`: the env gives the agents' valid actions in their infos; `state_bounds`:
        the global state's low and high, where the env names them."""
        group = possible if agents is None else [str(a) for a in agents]
        for name in group:
            if name not in possible:
                raise ConfigError(f"env.agents: {name!r} is not an agent of {env_id}; its agents: "
                                  f"{', '.join(possible)}")
        require(len(group) > 0 and len(set(group)) == len(group), "env.agents", group,
                f"must name distinct agents among: {', '.join(possible)}")
        self.possible_agents, self.env_id = list(possible), env_id
        self.agent_names, self.others = group, [a for a in possible if a not in group]
        self.obs_layouts = [ObservationLayout(observation_space(name), name, env_id) for name in group]
        act_spaces = [action_space(name) for name in group]
        act_space = act_spaces[0]
        # learners choosing among different numbers of Discrete actions act in the largest; each row's mask keeps
        # it to its own (algo=maskable_ppo)
        self.action_sizes: list[int] | None = None
        for name, space in zip(group[1:], act_spaces[1:], strict=True):
            if space == act_space:
                continue
            if not joint and all(type(a) is gym.spaces.Discrete and a.start == 0 for a in act_spaces):
                self.action_sizes = [int(a.n) for a in act_spaces]
                act_space = gym.spaces.Discrete(max(self.action_sizes))
                break
            raise ConfigError(f"env.agents: agent {name!r} of {env_id} has the action space {space}, {group[0]!r} has "
                              f"{act_space}; the learning agents act in one action space (or in Discrete ones of "
                              "different sizes, in row mode; list agents with equal action spaces in env.agents)")
        self.info_masks = info_masks
        self.has_masks = info_masks or self.action_sizes is not None or any(o.mask_in_obs for o in self.obs_layouts)
        if self.has_masks and (joint or not isinstance(act_space, gym.spaces.Discrete)):
            why = ("its learners' actions differ in size" if self.action_sizes is not None
                   else "it gives valid-action masks")
            raise ConfigError(f"env {env_id}: {why}, which rows of Discrete actions take (algo=maskable_ppo)"
                              + ("; env.joint=true (vdn, qmix, masac, maddpg) takes no masks" if joint else
                                 f"; its actions are {act_space}"))
        if joint and not isinstance(act_space, gym.spaces.Discrete | gym.spaces.Box):
            raise ConfigError(f"env.joint=true needs Discrete actions (algo=vdn, qmix) or Box ones (algo=masac, "
                              f"maddpg); agent {group[0]!r} of {env_id} has {act_space}")
        self.n_agents, self.num_copies, self.joint = len(group), num_copies, joint
        # joint mode: a Box agent's action line goes back to its own shape
        self._agent_action_shape = act_space.shape if isinstance(act_space, gym.spaces.Box) else None
        self.num_envs = self.num_copies * (1 if joint else self.n_agents)
        # agents observing different sizes (simple_tag's adversaries and prey) write theirs from the row's start and
        # leave the rest of `own_size` zero; their one-hot tells a shared network which layout a row has
        self.own_sizes = [layout.size for layout in self.obs_layouts]
        self.own_size = max(self.own_sizes)
        self.agent_id, self.critic_state = agent_id, critic_state
        self.state_size = state_size
        policy_size = self.own_size + (self.n_agents if agent_id else 0)
        self.active_column = policy_size if joint else None  # joint mode: each agent's `active` flag
        size = policy_size + int(joint) + self.state_size
        low, high = np.full(size, -np.inf, np.float32), np.full(size, np.inf, np.float32)
        lows = np.zeros((self.n_agents, self.own_size), np.float32)  # a padded column holds 0
        highs = np.zeros((self.n_agents, self.own_size), np.float32)
        for k, (own, layout) in enumerate(zip(self.own_sizes, self.obs_layouts, strict=True)):
            lows[k, :own] = np.asarray(layout.flat.low, np.float32).reshape(-1)
            highs[k, :own] = np.asarray(layout.flat.high, np.float32).reshape(-1)
        low[:self.own_size], high[:self.own_size] = lows.min(0), highs.max(0)  # bounds that hold every agent's
        if agent_id:
            low[self.own_size:policy_size], high[self.own_size:policy_size] = 0.0, 1.0
        if state_bounds is not None and self.state_size:
            low[-self.state_size:], high[-self.state_size:] = state_bounds
        if joint:
            low[policy_size], high[policy_size] = 0.0, 1.0
            shape = (len(group), size)
            self.single_observation_space = gym.spaces.Box(np.broadcast_to(low, shape), np.broadcast_to(high, shape),
                                                           dtype=np.float32)
            self.single_action_space: gym.spaces.Space[Any] = (
                JointActions(int(act_space.n), len(group), policy_size, self.state_size, state_bounds)
                if isinstance(act_space, gym.spaces.Discrete)
                else JointBox(act_space, len(group), policy_size, self.state_size))
        else:
            self.single_observation_space = (CentralizedObs(low, high, policy_size) if critic_state
                                             else gym.spaces.Box(low, high, dtype=np.float32))
            self.single_action_space = act_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        # the row that reports each copy's episode
        self.episode_rows = np.arange(self.num_copies) * (1 if joint else self.n_agents)
        m, n = self.num_copies, self.n_agents
        self._obs = np.zeros((m, n, size), np.float32)
        if agent_id:
            self._obs[:, :, self.own_size:policy_size] = np.eye(n, dtype=np.float32)
        self._active = np.zeros((m, n), bool)  # joint mode: what the `active` flags say (module docstring)
        self._returns = np.zeros((m, n))
        self._other_returns = np.zeros(m)  # the agents outside the group: their rewards' sum, for the team sum
        self._lengths = np.zeros(m, np.int64)
        self.agent_groups: dict[str, list[str]] = {}  # env.groups, where given (attach_parameter_layout)
        width = int(act_space.n) if self.has_masks else 0
        self._valid = np.ones((n, width), bool)  # each learner's own actions among the `width` of the rows
        for i, count in enumerate(self.action_sizes or []):
            self._valid[i, count:] = False
        self._masks = np.broadcast_to(self._valid, (m, n, width)).copy()

    def _set_mask(self, c: int, i: int, mask: np.ndarray | None) -> None:
        """Row (c, i)'s valid actions: its own actions, and of those the ones the env's `mask` allows."""
        self._masks[c, i] = self._valid[i]
        if mask is None:
            return
        size = int(self._valid[i].sum())
        if mask.shape != (size,):
            raise ConfigError(f"env {self.env_id} gave agent {self.agent_names[i]!r} an action mask of shape "
                              f"{mask.shape}; it needs one entry per action: ({size},)")
        self._masks[c, i, :size] &= mask

    def _mask_infos(self) -> dict[str, Any]:
        """The rows' valid actions (envs/masks.py reads them); none allowed reads as any (a row whose agent is gone)."""
        return {MASK_KEY: self._masks.reshape(self.num_envs, -1).copy()} if self.has_masks else {}

    def _observations(self) -> np.ndarray:
        return self._obs.copy() if self.joint else self._obs.reshape(self.num_envs, -1).copy()

    def agent_spaces(self, name: str) -> tuple[gym.spaces.Space[Any], gym.spaces.Space[Any]]:
        """Agent `name`'s own observation and action spaces, as the env gives them (for predict's dicts)."""
        raise NotImplementedError

    def _joint_action(self, action: Any) -> Any:
        return action if self._agent_action_shape is None else action.reshape(self._agent_action_shape)

    def noop(self, space: gym.spaces.Space[Any]) -> Any:
        """What an agent outside the group does: nothing (action 0, a zero vector clipped into its bounds)."""
        if isinstance(space, gym.spaces.Box):
            return np.clip(np.zeros(space.shape, space.dtype), space.low, space.high)
        return np.zeros(space.shape, space.dtype) if space.shape else 0

    def _outputs(self, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, ended: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """A step's outputs from each agent's reward and flags [copies, agents] and the copies whose episode `ended`
        (counters already updated): rows, or in joint mode one row per copy (module docstring)."""
        if self.joint:
            return self._joint_step(rewards, ended)
        m, n = self.num_copies, self.n_agents
        infos: dict[str, Any] = {}
        if ended.any():
            team, everyone = np.zeros((m, n)), np.zeros((m, n))
            team[:, 0] = self._returns.sum(axis=1)  # the team sum, never divided
            everyone[:, 0] = team[:, 0] + self._other_returns  # with the agents outside the group (env.agents)
            rows_ended = np.zeros((m, n), bool)
            rows_ended[:, 0] = ended
            lengths = np.zeros((m, n), np.int64)
            lengths[:, 0] = self._lengths
            infos = {"episode": {"r": team.reshape(-1), "l": lengths.reshape(-1)}, "_episode": rows_ended.reshape(-1),
                     "agent_episode": {"r": self._returns.reshape(-1).copy()},
                     "team_episode": {"r": everyone.reshape(-1)},
                     "_agent_episode": np.repeat(ended, n)}
        return (self._obs.reshape(self.num_envs, -1).copy(), rewards.reshape(-1), terminated.reshape(-1),
                truncated.reshape(-1), {**infos, **self._mask_infos()})

    def _joint_step(self, rewards: np.ndarray, ended: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Joint mode's step output: a row per copy, its team reward, and its episode's end (module docstring)."""
        terminated = ended & ~self._active.any(axis=1)
        truncated = ended & ~terminated
        infos: dict[str, Any] = {}
        if ended.any():
            team = self._returns.sum(axis=1)
            infos = {"episode": {"r": team, "l": self._lengths.copy()}, "_episode": ended.copy(),
                     "agent_episode": {"r": self._returns.reshape(-1).copy()},
                     "team_episode": {"r": team + self._other_returns},
                     "_agent_episode": np.repeat(ended, self.n_agents)}
        return self._obs.copy(), rewards.sum(axis=1), terminated, truncated, infos


class ParallelVectorEnv(AgentRowsEnv):
    """M copies of a PettingZoo ParallelEnv as a VectorEnv of M * N rows (module docstring). Copy c is reset
    with seed `seed + c * N`, so its rows' seeds never overlap another copy's (and a copy whose agents are
    independent single-agent envs can seed agent i with `seed + i`, as a single-agent vector env of M * N envs)."""

    state_capturable = True

    def __init__(self, copies: list[Any], env_id: str, agents: list[str] | None, agent_id: bool,
                 critic_state: bool, joint: bool = False, info_masks: bool = False) -> None:
        first = copies[0]
        if not _is_parallel(first):  # PettingZooEnvFactory makes a TurnBasedVectorEnv of AEC envs (envs/turn_based.py)
            raise ConfigError(f"env.id={env_id!r} made a {type(first).__name__}, not a PettingZoo Parallel env")
        self.copies, self.env_id = copies, env_id
        possible = list(first.possible_agents)
        self._use_env_state = (critic_state or joint) and self._has_state(first)
        # every agent's observation as numbers: the global state, where it is wanted and the env has none
        self._all_layouts = ({a: ObservationLayout(first.observation_space(a), a, env_id) for a in possible}
                             if (critic_state or joint) and not self._use_env_state else {})
        state_size, state_bounds = 0, None
        if critic_state or joint:
            state_size = (int(np.prod(first.state_space.shape)) if self._use_env_state
                          else sum(layout.size for layout in self._all_layouts.values()))
            state_bounds = self._state_bounds(first)
        self._init_layout(env_id, "env=pz", possible, agents, first.observation_space, first.action_space,
                          len(copies), agent_id, critic_state, joint, state_size, info_masks, state_bounds)
        m, n = self.num_copies, self.n_agents
        self._alive = np.zeros((m, n), bool)
        self._ended_by_termination = np.zeros((m, n), bool)
        self._left = np.zeros((m, n), bool)  # ended in this episode (an agent absent so far may still join)
        self._needs_reset = np.zeros(m, bool)

    def agent_spaces(self, name: str) -> tuple[gym.spaces.Space[Any], gym.spaces.Space[Any]]:
        return self.copies[0].observation_space(name), self.copies[0].action_space(name)

    def _entities(self) -> list[list[Any] | None]:
        """Each copy's world entities where the env has an MPE-style world (mpe2: agents and landmarks), else None."""
        found: list[list[Any] | None] = []
        for copy in self.copies:
            entities = getattr(getattr(copy_layers(copy)[-1], "world", None), "entities", None)
            found.append(list(entities) if isinstance(entities, list) and entities else None)
        return found

    def capture_state(self) -> dict[str, Any]:
        """What the attribute walk (envs/state.py) cannot keep: which entity of a world an entity's attribute refers
        to (simple_speaker_listener's goal landmark, simple_adversary's), by index. The walk keeps objects by value
        and writes a saved one into whatever object the attribute holds at restore, so a goal that pointed at another
        landmark then would take the saved landmark's state and keep pointing at the wrong one."""
        from rlcli.services.plain_state import Unsupported, encode

        worlds: list[dict[str, Any] | None] = []
        for entities in self._entities():
            if entities is None:
                worlds.append(None)
                continue
            refs, own = [], []
            for i, entity in enumerate(entities):
                values = {}
                for attr, value in vars(entity).items():
                    j = next((k for k, other in enumerate(entities) if value is other), None)
                    if j is not None:
                        refs.append([i, attr, j])
                        continue
                    try:
                        values[attr] = encode(value, objects=True)
                    except Unsupported:
                        continue  # not state the walk keeps either
                own.append(values)
            worlds.append({"refs": refs, "entities": own})
        return {"worlds": worlds}

    def restore_state(self, state: dict[str, Any]) -> None:
        """After the attribute walk: every entity's own state again, then its references to other entities."""
        from rlcli.services.plain_state import restore_into

        for entities, saved in zip(self._entities(), state["worlds"], strict=True):
            if entities is None or saved is None:
                continue
            for entity, values in zip(entities, saved["entities"], strict=True):
                for attr, value in values.items():
                    setattr(entity, attr, restore_into(getattr(entity, attr, None), value))
            for i, attr, j in saved["refs"]:
                if not (0 <= int(i) < len(entities) and 0 <= int(j) < len(entities)
                        and hasattr(entities[int(i)], str(attr))):
                    raise ValueError(f"the checkpoint's env state names entity {i}.{attr} -> {j}, which this world of "
                                     f"{len(entities)} entities does not have")
                setattr(entities[int(i)], str(attr), entities[int(j)])

    @staticmethod
    def gives_info_masks(env: Any, agents: list[str] | None, env_id: str) -> bool:
        """Whether the env's infos hold the agents' valid actions (`info[agent]['action_mask']`), read from a reset
        (a run's first reset reseeds the env); an env that gives them only after a step is not seen to."""
        try:
            _, infos = env.reset(seed=0)
        except Exception as error:  # noqa: BLE001  (a user's env raises what it likes)
            detail = (str(error).strip().splitlines() or [""])[-1]
            raise ConfigError(f"env {env_id} raised {type(error).__name__} at reset: {detail}") from None
        return any(MASK_KEY in ((infos or {}).get(a) or {}) for a in (agents or env.possible_agents))

    def _state_bounds(self, env: Any) -> tuple[np.ndarray, np.ndarray] | None:
        """The global state's bounds: the env's state_space's (a Box), or its agents' observations' end to end."""
        if not self._use_env_state:
            layouts = list(self._all_layouts.values())
            return (np.concatenate([np.asarray(x.flat.low, np.float32).reshape(-1) for x in layouts]),
                    np.concatenate([np.asarray(x.flat.high, np.float32).reshape(-1) for x in layouts]))
        space = env.state_space
        if not isinstance(space, gym.spaces.Box):
            return None
        return (np.broadcast_to(space.low, space.shape).reshape(-1).astype(np.float32),
                np.broadcast_to(space.high, space.shape).reshape(-1).astype(np.float32))

    @staticmethod
    def _has_state(env: Any) -> bool:
        """Whether the env gives a global state (`state()` and `state_space`), else the joint observation is used."""
        if getattr(env, "state_space", None) is None:
            return False
        try:
            env.reset(seed=0)  # PettingZoo's state() needs a reset first; a run's first reset reseeds it
            return env.state() is not None
        except (NotImplementedError, AttributeError, TypeError):
            return False

    def _write(self, c: int, obs: dict[str, Any], infos: dict[str, Any], state: bool = True) -> None:
        """Copy c's rows and masks from PettingZoo's dicts of observations and infos (agents that are gone keep their
        last observation, and allow no action: read as any, since it is not taken). `state`: False where nothing
        will bootstrap from this step's global state (the copy ended with every learner terminated), which some envs
        cannot give then (multiwalker's state() reads bodies its termination destroyed)."""
        env = self.copies[c]
        for i, (name, layout) in enumerate(zip(self.agent_names, self.obs_layouts, strict=True)):
            if name not in obs:
                self._masks[c, i] = False
                continue
            own, mask = layout.split(obs[name])
            self._obs[c, i, :self.own_sizes[i]] = own
            if self.has_masks:
                info = infos.get(name) or {}
                self._set_mask(c, i, mask if mask is not None else
                               None if MASK_KEY not in info else np.asarray(info[MASK_KEY], bool).reshape(-1))
        if self.active_column is not None:
            self._obs[c, :, self.active_column] = self._active[c]
        if self.state_size and state:
            if self._use_env_state:
                values = np.asarray(env.state(), np.float32).reshape(-1)
            else:
                values = np.concatenate([self._all_layouts[a].split(obs[a])[0] if a in obs
                                         else np.zeros(self._all_layouts[a].size, np.float32)
                                         for a in env.possible_agents])
            self._obs[c, :, -self.state_size:] = values

    def _reset_copy(self, c: int, seed: int | None) -> None:
        obs, infos = self.copies[c].reset(seed=seed)
        self._alive[c] = [name in obs for name in self.agent_names]
        self._active[c] = self._alive[c]
        self._ended_by_termination[c] = False
        self._left[c] = False
        self._obs[c, ~self._alive[c], :self.own_size] = 0.0  # not there yet (it may join): nothing of a last episode
        self._needs_reset[c] = False
        self._returns[c] = 0.0
        self._other_returns[c] = 0.0
        self._lengths[c] = 0
        self._write(c, obs, infos)

    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        for c in range(self.num_copies):
            if isinstance(seed, list):
                copy_seed = seed[c if self.joint else c * self.n_agents]
            else:
                copy_seed = None if seed is None else seed + c * self.n_agents
            self._reset_copy(c, copy_seed)
        return self._observations(), self._mask_infos()

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        m, n = self.num_copies, self.n_agents
        actions = np.asarray(actions)
        rewards = np.zeros((m, n))
        terminated = np.zeros((m, n), bool)
        truncated = np.zeros((m, n), bool)
        ended = np.zeros(m, bool)
        for c, env in enumerate(self.copies):
            if self._needs_reset[c]:  # the reset step after the copy's episode: no reward, every row not done
                self._reset_copy(c, None)
                continue
            was_alive = self._alive[c].copy()
            live = set(env.agents)
            acts = {name: self._joint_action(actions[c, i]) if self.joint else actions[c * n + i]
                    for i, name in enumerate(self.agent_names)
                    if was_alive[i] and name in live}
            acts.update({name: self.noop(env.action_space(name)) for name in self.others if name in live})
            obs, rew, term, trunc, infos = env.step(acts)
            for i, name in enumerate(self.agent_names):
                if not was_alive[i] and not self._left[c, i] and name in obs and name in env.agents:
                    # it joins: as a reset step, its first observation and no reward (the step before flagged it)
                    self._alive[c, i] = True
                    continue
                if not was_alive[i]:  # ended earlier or not there yet: a flag, so the collector stores nothing
                    terminated[c, i] = self._ended_by_termination[c, i]
                    truncated[c, i] = not self._ended_by_termination[c, i]
                    continue
                rewards[c, i] = float(rew.get(name, 0.0))
                t, u = bool(term.get(name, False)), bool(trunc.get(name, False))
                if not (t or u) and name not in obs:  # gone without a flag: count it as truncated
                    u = True
                if t or u:
                    self._alive[c, i] = False
                    self._left[c, i] = True
                    self._ended_by_termination[c, i] = t
                terminated[c, i], truncated[c, i] = t, u and not t
            # the copy's episode ends with the env's, or once every learner has left (one not there yet may join)
            copy_ends = not env.agents or (not self._alive[c].any() and bool(self._left[c].any())
                                           and all(self._left[c, i] or name not in live
                                                   for i, name in enumerate(self.agent_names)))
            # joint mode: an agent is active until it ends. At the team's last step those that end by truncation stay
            # active in the final observation, which the team's value bootstraps from; one truncated while its team
            # goes on ends there as if terminated (the team's future no longer holds it, and the same observation
            # is the current side of the team's next transition)
            self._active[c] = self._alive[c] | (was_alive & truncated[c]) if copy_ends else self._alive[c]
            # the final state is read only where a learner's episode ends unterminated (bootstrapped)
            self._write(c, obs, infos, state=not copy_ends or bool((was_alive & ~terminated[c]).any()))
            self._returns[c] += rewards[c]
            self._other_returns[c] += sum(float(rew.get(name, 0.0)) for name in self.others)
            self._lengths[c] += 1
            if copy_ends:
                self._alive[c] = False
                self._needs_reset[c] = True
                ended[c] = True
                gone = ~terminated[c] & ~truncated[c]  # the group's episode ends for every row of the copy
                truncated[c] |= gone
        return self._outputs(rewards, terminated, truncated, ended)

    def render(self) -> tuple[Any, ...] | None:
        """One frame per copy (envs made with render_mode='rgb_array')."""
        return tuple(env.render() for env in self.copies)

    def close_extras(self, **kwargs: Any) -> None:
        for env in self.copies:
            env.close()


def copy_layers(env: Any) -> list[Any]:
    """A copy's wrapper chain down to the raw env, whose attributes hold its state (for exact resume)."""
    layers: list[Any] = []
    while env is not None and all(env is not seen for seen in layers):
        layers.append(env)
        env = getattr(env, "aec_env", None) or getattr(env, "env", None)
    return layers


def agent_returns(infos: dict[str, Any], names: list[str]) -> dict[str, list[float]]:
    """Each agent's return in the copies whose episode ended in this step: {agent name: [returns]}."""
    if "_agent_episode" not in infos:
        return {}
    r, mask, n = infos["agent_episode"]["r"], infos["_agent_episode"], len(names)
    return {name: r[i::n][mask[i::n]].tolist() for i, name in enumerate(names)}


def group_returns(agent_returns: Mapping[str, Any], groups: Mapping[str, list[str]]) -> dict[str, np.ndarray]:
    """Each group's return per episode (the sum of its agents', never divided), where env.groups names more than
    one group; else {}."""
    if len(groups) <= 1:
        return {}
    return {group: np.sum([np.asarray(agent_returns[name], np.float64) for name in names], axis=0)
            for group, names in groups.items()}


def find_attr(envs: Any, name: str) -> Any:
    """An attribute of the innermost vector env (through vector wrappers), or None."""
    while envs is not None:
        if name in vars(envs) or hasattr(type(envs), name):
            return getattr(envs, name)
        envs = getattr(envs, "env", None)
    return None


def check_separate_params(share_params: bool, joint: bool, agent_id: bool) -> None:
    """env.share_params=false in row mode finds a row's agent by its one-hot index (actors/per_agent.py)."""
    if not share_params and not joint and not agent_id:
        raise ConfigError("env.share_params=false gives each agent its own network and finds a row's agent by "
                          "its one-hot index: set env.agent_id=true (or env.share_params=true)")


def copies_of(num_envs: int, n_agents: int, joint: bool, env_id: str) -> int:
    """The copies of an env that `num_envs` training rows make: one row per agent (joint mode: per copy)."""
    if joint:
        return num_envs
    if num_envs % n_agents:
        lower = max(n_agents, num_envs - num_envs % n_agents)
        raise ConfigError(f"train.num_envs={num_envs}: env {env_id} has {n_agents} agents, one row each, so "
                          f"train.num_envs must be a multiple of {n_agents} (e.g. {lower} = {lower // n_agents} "
                          f"cop{'y' if lower == n_agents else 'ies'} of the env)")
    return num_envs // n_agents


GROUPINGS = ("prefix",)  # env.groups as a word; else null (one group) or a mapping {group: [agents]}


def resolve_groups(groups: Any, learners: list[str], env_id: str) -> dict[str, list[str]]:
    """env.groups -> {group name: its agents, in row order}, covering every learning agent once; one group (null)
    gives {}. "prefix" groups agents by their name without its `_<number>` (TorchRL's grouping of MPE: adversary_0,
    adversary_1 -> adversary; agent_0 -> agent)."""
    if groups is None:
        return {}
    if isinstance(groups, str):
        if groups not in GROUPINGS:
            raise ConfigError(f"env.groups={groups!r}: choose from: null (one group), {', '.join(GROUPINGS)}, or a "
                              "mapping {group: [agents]} (env.groups={adversary: [adversary_0, adversary_1]})")
        by_prefix: dict[str, list[str]] = {}
        for name in learners:
            stem, _, number = name.rpartition("_")
            by_prefix.setdefault(stem if stem and number.isdigit() else name, []).append(name)
        return by_prefix
    if not isinstance(groups, Mapping) or not groups:
        raise ConfigError(f"env.groups={groups!r}: choose from: null (one group), {', '.join(GROUPINGS)}, or a "
                          "mapping {group: [agents]} (env.groups={adversary: [adversary_0, adversary_1]})")
    owner: dict[str, str] = {}
    for group, members in groups.items():
        names = _group_agents(str(group), members, learners)
        for name in names:
            if name not in learners:
                raise ConfigError(f"env.groups.{group}: {name!r} is not a learning agent of {env_id}; its learning "
                                  f"agents (env.agents): {', '.join(learners)}")
            if name in owner:
                raise ConfigError(f"env.groups: agent {name!r} is in both {owner[name]!r} and {str(group)!r}; each "
                                  "agent belongs to one group")
            owner[name] = str(group)
    missing = [name for name in learners if name not in owner]
    if missing:
        raise ConfigError(f"env.groups: agent {missing[0]!r} of {env_id} is in no group; list every learning agent "
                          f"({', '.join(learners)}) in one group, or name the learners in env.agents")
    return {str(group): [name for name in learners if owner[name] == str(group)] for group in groups}


def _group_agents(group: str, members: Any, learners: list[str]) -> list[str]:
    """A group's agents from its entry in env.groups: a list of agents, or {agents: [...], share_params: bool}."""
    if isinstance(members, Mapping):
        unknown = sorted(set(map(str, members)) - {"agents", "share_params"})
        if unknown or "agents" not in members:
            raise ConfigError(f"env.groups.{group}: {'unknown key ' + repr(unknown[0]) if unknown else 'no agents'}; a "
                              "group is a list of agents or {agents: [...], share_params: false}")
        if not isinstance(members.get("share_params", True), bool):
            raise ConfigError(f"env.groups.{group}.share_params={members['share_params']!r}: true or false")
        members = members["agents"]
    names = [members] if isinstance(members, str) else list(members) if isinstance(members, Sequence) else None
    if not names:
        raise ConfigError(f"env.groups.{group}={members!r}: list the group's agents (e.g. [{learners[0]}])")
    return [str(name) for name in names]


def separate_groups(groups: Any) -> set[str]:
    """The groups of env.groups whose agents each have their own network ({agents: [...], share_params: false})."""
    if not isinstance(groups, Mapping):
        return set()
    return {str(group) for group, members in groups.items()
            if isinstance(members, Mapping) and members.get("share_params", True) is False}


def attach_parameter_layout(vec: AgentRowsEnv, share_params: bool, groups: Any) -> None:
    """Which learning agents share parameters, for the actor to build from (actors/per_agent.py): one set for all
    (nothing attached), one per group (env.groups; a group with share_params: false one per agent of it), or one per
    agent (env.share_params=false). The groups are kept on the env as `agent_groups` for their returns."""
    vec.agent_groups = resolve_groups(groups, vec.agent_names, vec.env_id)
    separate = separate_groups(groups)
    copy_index: dict[str, int] = {}  # each learner's network: its group's one, or its own in a separate group
    copies = 0
    for group, names in vec.agent_groups.items():
        for k, name in enumerate(names):
            copies += group in separate or k == 0
            copy_index[name] = copies - 1
    if vec.agent_groups and not vec.joint and vec.agent_id:  # what algo.groups builds each group's algorithm from
        names = list(vec.agent_groups)
        group_of = {name: names.index(group) for group, members in vec.agent_groups.items() for name in members}
        vec.single_observation_space.group_layout = AgentGroups(  # type: ignore[attr-defined]
            tuple(names), tuple(group_of[name] for name in vec.agent_names),
            tuple(not share_params or group in separate for group in names), vec.own_size)
    if share_params and len(vec.agent_groups) <= 1 and not separate:
        return
    if not vec.joint and not vec.agent_id:
        raise ConfigError(f"env.groups ({', '.join(vec.agent_groups)}) gives agents networks of their own, found by "
                          "a row's one-hot index: set env.agent_id=true (or env.groups=null)")
    copy_of = None if not share_params else tuple(copy_index[name] for name in vec.agent_names)
    vec.single_observation_space.separate_agents = SeparateAgents(  # type: ignore[attr-defined]
        vec.n_agents, None if vec.joint else vec.own_size, vec.joint, copy_of)


@ENVS.register("pz")
class PettingZooEnvFactory:
    """Settings for a PettingZoo Parallel env; `make()` builds a ParallelVectorEnv of its copies.

    Training envs: `num_envs` (train.num_envs) counts rows, one per agent, so the rollout, the budget and env steps
    count agent steps; it must be a multiple of the group's agents. Test envs: `num_envs` (train.test_episodes)
    counts copies, each one test episode whose return is the team sum."""

    def __init__(self, id: str | None, kwargs: dict[str, Any] | None = None, agents: list[str] | None = None,
                 agent_id: bool = True, critic_state: bool = False, joint: bool = False, normalize_obs: bool = False,
                 clip_obs: float = 10.0, reward_threshold: float | None = None, share_params: bool = True,
                 groups: Any = None) -> None:
        self.creator = resolve_parallel_env(id)
        self.id = str(id)
        self.kwargs = dict(kwargs or {})
        self.agents = None if agents is None else [str(a) for a in agents]
        self.agent_id, self.critic_state, self.joint = agent_id, critic_state, joint
        self.share_params, self.groups = share_params, groups
        check_separate_params(share_params, joint, agent_id)
        require(clip_obs > 0, "env.clip_obs", clip_obs, "must be > 0")
        self.normalize_obs, self.clip_obs = normalize_obs, clip_obs
        self.goal = None  # no goal-conditioned multi-agent envs
        self.spec = ParallelEnvSpec(self.id, self.id, reward_threshold)
        self.info_masks: bool | None = None
        probe = self._copies(1)
        # checks the agents and their spaces now, before any run state exists
        self.n_agents = probe.n_players if isinstance(probe, TurnBasedVectorEnv) else probe.n_agents
        self.turn_based = isinstance(probe, TurnBasedVectorEnv)  # an AEC env (envs/turn_based.py)
        self.turn_masks = isinstance(probe, TurnBasedVectorEnv) and probe.has_masks
        # a Parallel env's valid actions: the env's masks, or learners with different numbers of actions
        self.row_masks = isinstance(probe, ParallelVectorEnv) and probe.has_masks
        self.padded_actions = isinstance(probe, ParallelVectorEnv) and probe.action_sizes is not None
        probe.close()

    @property
    def reward_threshold(self) -> float | None:
        """env.reward_threshold: a team return (the sum over the group's agents) that stops the run."""
        return self.spec.reward_threshold

    def _copies(self, count: int, render_mode: str | None = None,
                vs_random: bool = False) -> ParallelVectorEnv | TurnBasedVectorEnv:
        kwargs = dict(self.kwargs, **({"render_mode": render_mode} if render_mode else {}))
        try:
            copies = [self.creator(**kwargs) for _ in range(count)]
        except TypeError as error:
            detail = (str(error).strip().splitlines() or [type(error).__name__])[-1]
            raise ConfigError(f"env {self.id} refused env.kwargs={self.kwargs}: {detail}") from None
        vec: ParallelVectorEnv | TurnBasedVectorEnv
        if is_turn_based(copies[0]):  # an AEC env: self-play, one row per player (envs/turn_based.py)
            self._check_turn_based(copies[0])
            vec = TurnBasedVectorEnv(copies, self.id, self.agent_id, vs_random)
            if not self.share_params:  # what the actor builds its per-agent networks from (actors/per_agent.py)
                vec.single_observation_space.separate_agents = SeparateAgents(  # type: ignore[attr-defined]
                    vec.n_players, vec.own_size, False)
            return vec
        if self.info_masks is None:  # the factory's first env, made to check the settings
            self.info_masks = ParallelVectorEnv.gives_info_masks(copies[0], self.agents, self.id)
        vec = ParallelVectorEnv(copies, self.id, self.agents, self.agent_id, self.critic_state, self.joint,
                                self.info_masks)
        attach_parameter_layout(vec, self.share_params, self.groups)
        return vec

    def _check_turn_based(self, env: Any) -> None:
        module = self.id.partition(":")[0]
        if callable(getattr(importlib.import_module(module), "parallel_env", None)):  # simultaneous moves, as AEC
            raise ConfigError(f"env.id={self.id!r} made a {type(env).__name__}, an AEC (turn-based) env; env=pz takes "
                              f"PettingZoo Parallel envs where the module has one: use env.id={module} (its "
                              "parallel_env()); turn-based games are those with env() alone (pettingzoo.classic)")
        for key, value, why in (("agents", self.agents is not None, "every player is played by the one policy"),
                                ("critic_state", self.critic_state, "algo=mappo's centralized critic"),
                                ("joint", self.joint, "algo=vdn, qmix, masac, maddpg's joint transitions"),
                                ("groups", self.groups is not None, "groups of players")):
            if value:
                raise ConfigError(f"env.{key}={getattr(self, key)}: env {self.id} is a turn-based (AEC) env, which "
                                  f"env=pz trains by self-play ({why} is not built for it); use algo=maskable_ppo "
                                  f"(or ppo, where the env has no action masks) with env.{key} unset")

    def make(self, num_envs: int, mode: str = "auto", *, gamma: float = 0.99, eval: bool = False,
             render: bool = False, masks: bool = False) -> VectorEnv:
        """Training envs: `num_envs` rows (num_envs / agents copies; joint mode: `num_envs` copies); test envs
        (`eval`): `num_envs` copies."""
        if self.turn_based:
            if self.turn_masks and not masks:
                raise ConfigError(f"env {self.id} is a turn-based (AEC) env with action masks, which this algorithm "
                                  "cannot take (it would play illegal moves): use algo=maskable_ppo (the algorithms "
                                  "that take masks)")
            if masks and not self.turn_masks:
                raise ConfigError(f"this algorithm needs valid-action masks, and the turn-based env {self.id} gives "
                                  "none (neither a Dict observation {'observation', 'action_mask'} nor "
                                  "info['action_mask']): use algo=ppo")
        elif self.row_masks and not masks:
            why = ("its learners choose among different numbers of actions, which rows mask to each one's own"
                   if self.padded_actions else "it gives valid-action masks, which this algorithm cannot take (it "
                   "would take actions the env forbids)")
            raise ConfigError(f"env {self.id}: {why}; use algo=maskable_ppo (the algorithms that take masks)")
        elif masks and not self.row_masks:
            raise ConfigError(f"this algorithm needs valid-action masks, and env {self.id} gives none (neither a Dict "
                              "observation with an 'action_mask' entry nor info['action_mask'] per agent): use "
                              "algo=ppo, ippo or mappo")
        if mode not in ("auto", "sync"):
            raise ConfigError(f"train.vector_mode={mode}: env=pz steps its copies in this process; choose from: "
                              "auto, sync")
        if eval:  # turn-based: the policy against uniformly random players, one row per copy
            return self._copies(num_envs, "rgb_array" if render else None, vs_random=True)
        return self._copies(copies_of(num_envs, self.n_agents, self.joint, self.id))
