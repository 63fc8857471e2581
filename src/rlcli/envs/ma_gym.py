"""Level-Based Foraging and the multi-robot warehouse as PettingZoo Parallel envs (`env=lbf`, `env=rware`).

`lbforaging` and `rware` (pip install -e '.[multiagent]') each register gymnasium envs whose spaces are Tuples, one
entry per agent, whose step takes a tuple of actions and returns a list of per-agent rewards and one `done` flag for
the team. `TupleAgentsEnv` turns such an env into a PettingZoo ParallelEnv, agents `agent_0` ... `agent_{n-1}`, so that
env=pz (envs/multiagent.py) trains it: rows, joint mode, shared or separate parameters, team sums, resume.

- Every agent lives until the team's episode ends. LBF's `done` means either that every food is eaten (a terminal
  state: `terminated`) or its step limit (`truncated`, so that a learner bootstraps); RWARE has no terminal state
  (its `done` is its step limit or `max_inactivity_steps`), so it ends as `truncated`.
- `state()` is every agent's observation, concatenated (neither env has a global state of its own).
- Exact resume: through envs/state.py's capture_state / restore_state hook, the env's world as plain data (the RNG,
  the grid, the players or robots and shelves, the step counters), RWARE's shelves and robots rebuilt with the links
  between them (a robot's shelf, the request queue) kept as indices. The gymnasium env and the agents' spaces sit in
  slots, out of the attributes that envs/state.py captures by themselves.
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any

import gymnasium as gym
import numpy as np
from pettingzoo import ParallelEnv

from rlcli.registry import ConfigError

_PACKAGES = {"lbf": ("lbforaging", "Foraging-8x8-2p-2f-coop-v3",
                     "Foraging[-2s]-<5..19>x<same>-<2..9>p-<1..4>f[-coop]-v3"),
             "rware": ("rware", "rware-tiny-2ag-v2", "rware-<tiny|small|medium|large>-<1..19>ag[-easy|-hard]-v2")}


class TupleAgentsEnv(ParallelEnv):  # type: ignore[misc]
    """A gymnasium env with Tuple spaces (one entry per agent) as a PettingZoo ParallelEnv (module docstring).
    `terminal(raw_env)` says whether the team's `done` is a terminal state (else it is a truncation)."""

    # every attribute in a slot, out of those that envs/state.py captures by themselves: the gymnasium env's state is
    # what capture_state gives (its world, the live agents, the last observations); the rest is rebuilt from the config
    __slots__ = ("_env", "_obs_spaces", "_act_spaces", "kind", "possible_agents", "agents", "state_space",
                 "render_mode", "metadata", "_last_obs")

    def __init__(self, env: Any, kind: str, render_mode: str | None = None) -> None:
        self._env = env
        self.kind = kind
        raw = env.unwrapped
        n = len(raw.action_space)
        self.possible_agents = [f"agent_{i}" for i in range(n)]
        self.agents: list[str] = []
        self._obs_spaces: dict[str, Any] = dict(zip(self.possible_agents, raw.observation_space, strict=True))
        self._act_spaces: dict[str, Any] = dict(zip(self.possible_agents, raw.action_space, strict=True))
        for name, space in self._obs_spaces.items():
            if not isinstance(space, gym.spaces.Box):
                raise ConfigError(f"env={kind}: agent {name} has {space} observations; env={kind} takes the flat "
                                  "(Box) ones (LBF: grid_observation=false; RWARE: the default observation_type)")
        lows = [np.broadcast_to(s.low, s.shape).reshape(-1) for s in self._obs_spaces.values()]
        highs = [np.broadcast_to(s.high, s.shape).reshape(-1) for s in self._obs_spaces.values()]
        self.state_space = gym.spaces.Box(np.concatenate(lows).astype(np.float32),
                                          np.concatenate(highs).astype(np.float32), dtype=np.float32)
        self.render_mode = render_mode
        self.metadata = {"name": f"{kind}_v0", "render_modes": ["human", "rgb_array"], "is_parallelizable": True}
        self._last_obs: list[np.ndarray] = [np.zeros(s.shape, np.float32) for s in self._obs_spaces.values()]

    def capture_state(self) -> dict[str, Any]:
        """The env's world, the live agents and their last observations as plain values (envs/state.py's hook, for
        exact resume)."""
        return {"world": _WORLDS[self.kind][0](self._env.unwrapped), "agents": list(self.agents),
                "last_obs": [o.copy() for o in self._last_obs]}

    def restore_state(self, state: dict[str, Any]) -> None:
        _WORLDS[self.kind][1](self._env.unwrapped, state["world"])
        self.agents = [str(a) for a in state["agents"]]
        self._last_obs = [np.array(o, np.float32) for o in state["last_obs"]]

    @property
    def gym_env(self) -> Any:
        """The gymnasium env."""
        return self._env

    def observation_space(self, agent: str) -> gym.spaces.Space[Any]:
        space: gym.spaces.Space[Any] = self._obs_spaces[agent]
        return space

    def action_space(self, agent: str) -> gym.spaces.Space[Any]:
        space: gym.spaces.Space[Any] = self._act_spaces[agent]
        return space

    def state(self) -> np.ndarray:
        return np.concatenate([np.asarray(o, np.float32).reshape(-1) for o in self._last_obs])

    def reset(self, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        obs, _ = self._env.reset(seed=seed)
        self.agents = list(self.possible_agents)
        self._last_obs = [np.asarray(o, np.float32) for o in obs]
        return dict(zip(self.agents, self._last_obs, strict=True)), {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict[str, Any], ...]:
        joint = []  # the env's tuple of actions; an agent without one does nothing (action 0: LBF's NONE, RWARE's NOOP)
        for name in self.possible_agents:
            action = np.asarray(actions.get(name, np.zeros(self._act_spaces[name].shape, np.int64)))
            joint.append(int(action.reshape(-1)[0]) if isinstance(self._act_spaces[name], gym.spaces.Discrete)
                         else action)
        obs, rewards, done, truncated, _ = self._env.step(tuple(joint))  # rewards: a list, one per agent
        self._last_obs = [np.asarray(o, np.float32) for o in obs]
        done, truncated = bool(done), bool(truncated)
        terminal = done and _WORLDS[self.kind][2](self._env.unwrapped)
        ended_by_limit = (done or truncated) and not terminal
        names = self.agents
        out: tuple[dict[str, Any], ...] = (dict(zip(names, self._last_obs, strict=True)),
               {a: float(r) for a, r in zip(names, rewards, strict=True)},
               {a: terminal for a in names}, {a: ended_by_limit for a in names}, {a: {} for a in names})
        if terminal or ended_by_limit:
            self.agents = []
        return out

    def render(self) -> Any:
        """The env's own drawing (pyglet), `render_mode` 'rgb_array' (a frame) or 'human' (a window)."""
        try:
            return self._env.render(mode=self.render_mode or "human")
        except Exception as error:  # noqa: BLE001  (pyglet without a display: NoSuchDisplayException, ImportError)
            if "display" not in f"{type(error).__name__} {error}".lower():
                raise
            raise ConfigError(f"env={self.kind} draws its frames with pyglet, which needs a display ({error}): run "
                              "under a virtual one (xvfb-run <the command>) or without video") from None

    def close(self) -> None:
        self._env.close()


# -- the worlds as plain data (exact resume) --------------------------------------------------------------------------

def _rng_state(raw: Any) -> dict[str, Any]:
    return dict(raw.np_random.bit_generator.state)


def _set_rng(raw: Any, state: dict[str, Any]) -> None:
    generator = np.random.Generator(getattr(np.random, str(state["bit_generator"]))())
    generator.bit_generator.state = state
    raw.np_random = generator


def _lbf_world(raw: Any) -> dict[str, Any]:
    return {"rng": _rng_state(raw), "field": raw.field.copy(), "current_step": raw.current_step,
            "game_over": raw._game_over, "food_spawned": raw._food_spawned,
            "players": [{"position": None if p.position is None else [int(v) for v in p.position],
                         "level": None if p.level is None else int(p.level),
                         "score": p.score, "reward": p.reward} for p in raw.players]}


def _set_lbf_world(raw: Any, world: dict[str, Any]) -> None:
    _set_rng(raw, world["rng"])
    raw.field = np.array(world["field"], np.int32)
    raw.current_step, raw._game_over, raw._food_spawned = world["current_step"], world["game_over"], \
        world["food_spawned"]
    for player, saved in zip(raw.players, world["players"], strict=True):
        player.position = None if saved["position"] is None else tuple(np.int64(v) for v in saved["position"])
        player.level = None if saved["level"] is None else np.int64(saved["level"])
        player.score, player.reward, player.history = saved["score"], saved["reward"], []
        player.field_size = raw.field.shape
    if all(p.position is not None for p in raw.players):
        raw._gen_valid_moves()


def _lbf_terminal(raw: Any) -> bool:
    return bool(raw.field.sum() == 0)  # every food eaten; else `done` was the step limit


def _rware_world(raw: Any) -> dict[str, Any]:
    shelfs = list(getattr(raw, "shelfs", []))
    index = {id(s): i for i, s in enumerate(shelfs)}

    def entity(e: Any) -> dict[str, Any]:
        return {"id": int(e.id), "x": int(e.x), "y": int(e.y),
                "prev_x": None if e.prev_x is None else int(e.prev_x),
                "prev_y": None if e.prev_y is None else int(e.prev_y)}

    return {"rng": _rng_state(raw), "grid": raw.grid.copy(), "cur_steps": raw._cur_steps,
            "cur_inactive_steps": raw._cur_inactive_steps,
            "shelfs": [entity(s) for s in shelfs],
            # a.message as a list: an empty numpy array does not survive a checkpoint (plain_state's bytes b"")
            "agents": [dict(entity(a), dir=a.dir.value, message=[float(v) for v in a.message],
                            req_action=None if a.req_action is None else a.req_action.value,
                            carrying=None if a.carrying_shelf is None else index[id(a.carrying_shelf)],
                            has_delivered=bool(a.has_delivered)) for a in raw.agents],
            "requests": [index[id(s)] for s in raw.request_queue]}


def _set_rware_world(raw: Any, world: dict[str, Any]) -> None:
    from rware.warehouse import Action, Agent, Direction, Shelf

    def entity(cls: Any, saved: dict[str, Any]) -> Any:
        e = cls.__new__(cls)  # the attributes saved, not a constructor's (it counts ids)
        for key in ("id", "x", "y", "prev_x", "prev_y"):
            setattr(e, key, saved[key])
        return e

    _set_rng(raw, world["rng"])
    raw.grid = np.array(world["grid"], np.int32)
    raw._cur_steps, raw._cur_inactive_steps = world["cur_steps"], world["cur_inactive_steps"]
    raw.shelfs = [entity(Shelf, s) for s in world["shelfs"]]
    agents = []
    for saved in world["agents"]:
        a = entity(Agent, saved)
        a.dir = Direction(saved["dir"])
        a.message = np.array(saved["message"])
        a.req_action = None if saved["req_action"] is None else Action(saved["req_action"])
        a.carrying_shelf = None if saved["carrying"] is None else raw.shelfs[saved["carrying"]]
        a.canceled_action, a.has_delivered = None, saved["has_delivered"]
        agents.append(a)
    raw.agents = agents
    raw.request_queue = [raw.shelfs[i] for i in world["requests"]]


_WORLDS = {"lbf": (_lbf_world, _set_lbf_world, _lbf_terminal),
           "rware": (_rware_world, _set_rware_world, lambda raw: False)}


# -- makers: env=lbf, env=rware ---------------------------------------------------------------------------------------

def _make(kind: str, task: str | None, render_mode: str | None, kwargs: dict[str, Any]) -> TupleAgentsEnv:
    package, example, pattern = _PACKAGES[kind]
    try:
        __import__(package)
    except ImportError:
        raise ConfigError(f"env={kind} needs the {package} package: pip install -e '.[multiagent]'") from None
    if not task:
        raise ConfigError(f"env={kind}: env.kwargs.task is not set; a gymnasium id of {package}, e.g. {example}")
    ids = [i for i, spec in gym.registry.items()
           if isinstance(spec.entry_point, str) and spec.entry_point.startswith(f"{package}.")]
    if task not in ids:
        close = difflib.get_close_matches(str(task), ids, n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"env.kwargs.task={task!r} is not a {package} env id; its ids: {pattern} "
                          f"(e.g. {example}){hint}")
    spec = gym.spec(task)
    cls: Any = gym.envs.registration.load_env_creator(str(spec.entry_point))
    accepted = [p for p in inspect.signature(cls).parameters if p not in ("self", "render_mode")]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise ConfigError(f"env.kwargs: {', '.join(unknown)} not taken by {task}; choose from: task, "
                          f"{', '.join(accepted)}")
    if kind == "rware":  # its enums by name from a config (reward_type: GLOBAL)
        from rware.warehouse import ObservationType, RewardType

        for key, enum_type in (("reward_type", RewardType), ("observation_type", ObservationType)):
            if isinstance(kwargs.get(key), str):
                names = [m.name for m in enum_type]
                if kwargs[key].upper() not in names:
                    raise ConfigError(f"env.kwargs.{key}={kwargs[key]!r}; choose from: {', '.join(names)}")
                kwargs = dict(kwargs, **{key: enum_type[kwargs[key].upper()]})
    try:  # the env class itself, no gymnasium wrappers: its own attributes are its whole state (`world`)
        env = cls(**{**spec.kwargs, **kwargs})
    except (AssertionError, TypeError, ValueError, KeyError) as error:
        detail = (str(error).strip().splitlines() or [type(error).__name__])[-1]
        raise ConfigError(f"env {task} refused env.kwargs={kwargs}: {detail}") from None
    if kind == "lbf":
        _index_players(env)
    return TupleAgentsEnv(env, kind, render_mode)


def _index_players(env: Any) -> None:
    """LBF loads food by popping players from a `set`, whose order follows their hashes: by default their memory
    addresses, so which player is rewarded when two reach one food could differ between processes (a seeded run
    twice, a run and its resume). Each player hashes by its index instead (an equal player is still only itself)."""
    for index, player in enumerate(env.players):
        player.__class__ = _indexed_player_class(type(player))
        player._rlcli_index = index


_INDEXED: dict[type, type] = {}


def _indexed_player_class(player_type: type) -> type:
    if player_type in _INDEXED.values():
        return player_type
    if player_type not in _INDEXED:
        _INDEXED[player_type] = type(f"Indexed{player_type.__name__}", (player_type,),
                                     {"__hash__": lambda self: self._rlcli_index})
    return _INDEXED[player_type]


def lbf(task: str | None = "Foraging-8x8-2p-2f-coop-v3", render_mode: str | None = None,
        **kwargs: Any) -> TupleAgentsEnv:
    """env=lbf (env=pz env.id=rlcli.envs.ma_gym:lbf): Level-Based Foraging; `task` a lbforaging gymnasium id, other
    kwargs the env's own (max_episode_steps, sight, penalty, ...)."""
    return _make("lbf", task, render_mode, kwargs)


def rware(task: str | None = "rware-tiny-2ag-v2", render_mode: str | None = None, **kwargs: Any) -> TupleAgentsEnv:
    """env=rware (env=pz env.id=rlcli.envs.ma_gym:rware): the multi-robot warehouse; `task` a rware gymnasium id,
    other kwargs the env's own (max_steps, max_inactivity_steps, reward_type, ...)."""
    return _make("rware", task, render_mode, kwargs)
