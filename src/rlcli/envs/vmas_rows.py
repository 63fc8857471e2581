"""VMAS's batched env as rows (envs/vmas.py's factory builds it): the layout env=pz shares (envs/multiagent.py's
AgentRowsEnv), VMAS's one batched step for all copies, per-copy resets, and the world's state for exact resume. Apart
from the factory so that composing a config (which imports the env factories) does not import torch."""

from __future__ import annotations

import enum
import random
import re
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlcli.envs.multiagent import AgentRowsEnv
from rlcli.registry import ConfigError


def _space(space: Any, what: str, scenario: str) -> gym.spaces.Space[Any]:
    """VMAS's (old gym) space as gymnasium's."""
    kind = type(space).__name__
    if kind == "Box":
        return gym.spaces.Box(np.asarray(space.low, np.float32), np.asarray(space.high, np.float32), dtype=np.float32)
    if kind == "Discrete":
        return gym.spaces.Discrete(int(space.n))
    if kind == "MultiDiscrete":
        return gym.spaces.MultiDiscrete(np.asarray(space.nvec, np.int64))
    raise ConfigError(f"env=vmas env.scenario={scenario}: its agents have {kind} {what}s, which env=vmas does not "
                      "take (Box observations; Box, Discrete or MultiDiscrete actions)")


class VmasVectorEnv(AgentRowsEnv):
    """VMAS's batched env of M copies as a VectorEnv of M * N rows, or M joint rows (module docstring)."""

    state_capturable = True  # through capture_state / restore_state (envs/state.py)

    def __init__(self, env: Any, env_id: str, agents: list[str] | None, agent_id: bool, critic_state: bool,
                 joint: bool, max_steps: int | None) -> None:
        self.vmas, self.env_id, self.max_steps = env, env_id, max_steps
        possible = [str(agent.name) for agent in env.agents]
        self._obs_spaces = {name: _space(s, "observation", env_id)
                            for name, s in zip(possible, env.observation_space, strict=True)}
        self._act_spaces = {name: _space(s, "action", env_id)
                            for name, s in zip(possible, env.action_space, strict=True)}
        state_size = (sum(int(np.prod(s.shape or ())) for s in self._obs_spaces.values())
                      if critic_state or joint else 0)
        self._init_layout(env_id, "env=vmas", possible, agents, self._obs_spaces.__getitem__,
                          self._act_spaces.__getitem__, int(env.num_envs), agent_id, critic_state, joint, state_size)
        self._group = [possible.index(name) for name in self.agent_names]
        self._other = [possible.index(name) for name in self.others]
        self._needs_reset = np.zeros(self.num_copies, bool)
        self._rng = list(type(env).vmas_random_state)  # VMAS's random state for this env (reset(seed) seeds it)
        # on a GPU, scenarios draw from the device's generator, which VMAS does not swap: this env keeps its own
        self._cuda = torch.device(env.device) if torch.device(env.device).type == "cuda" else None
        self._cuda_rng = torch.cuda.get_rng_state(self._cuda) if self._cuda is not None else None

    def agent_spaces(self, name: str) -> tuple[gym.spaces.Space[Any], gym.spaces.Space[Any]]:
        return self._obs_spaces[name], self._act_spaces[name]

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A call into VMAS with this env's random state (VMAS swaps its class-wide state in around each call)."""
        shared = type(self.vmas).vmas_random_state
        outside = list(shared)
        shared[:] = self._rng
        cuda, outside_cuda = self._cuda, None
        if cuda is not None and self._cuda_rng is not None:  # the device's generator too (test envs, the policy)
            outside_cuda = torch.cuda.get_rng_state(cuda)
            torch.cuda.set_rng_state(self._cuda_rng, cuda)
        try:
            return fn(*args, **kwargs)
        finally:
            self._rng = list(shared)
            shared[:] = outside
            if cuda is not None and outside_cuda is not None:
                self._cuda_rng = torch.cuda.get_rng_state(cuda)
                torch.cuda.set_rng_state(outside_cuda, cuda)

    def _seed(self, seed: int) -> None:
        self._rng = [torch.Generator().manual_seed(seed).get_state(), np.random.RandomState(seed).get_state(),
                     random.Random(seed).getstate()]
        if self._cuda is not None:
            self._cuda_rng = torch.Generator(self._cuda).manual_seed(seed).get_state()

    def _write(self, obs: list[torch.Tensor]) -> None:
        """Every copy's rows from VMAS's observations, one [M, obs] tensor per agent."""
        m = self.num_copies
        for i, j in enumerate(self._group):  # agents observing fewer inputs leave the rest of their row 0
            self._obs[:, i, :self.own_sizes[i]] = obs[j].reshape(m, -1).detach().to("cpu", torch.float32).numpy()
        if self.active_column is not None:
            self._obs[:, :, self.active_column] = self._active
        if self.state_size:
            state = torch.cat([o.reshape(m, -1) for o in obs], dim=1).detach().to("cpu", torch.float32).numpy()
            self._obs[:, :, -self.state_size:] = state[:, None, :]

    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        first = seed[0] if isinstance(seed, list) else seed  # one batched env, one seed
        if first is not None:
            self._seed(int(first))
        obs = self._call(self.vmas.reset)
        self._active[:] = True
        self._needs_reset[:] = False
        self._returns[:] = 0.0
        self._other_returns[:] = 0.0
        self._lengths[:] = 0
        self._write(obs)
        return self._observations(), {}

    def _vmas_actions(self, actions: Any) -> list[torch.Tensor]:
        """Rows' actions as VMAS takes them: a [M, action] tensor per agent (agents outside the group: noop)."""
        m, n = self.num_copies, self.n_agents
        actions = np.asarray(actions)
        per_agent = actions.reshape(m, n, -1)  # row mode: row c * N + i; joint mode: [M, N, ...]
        device = self.vmas.device
        out: list[torch.Tensor | None] = [None] * len(self.possible_agents)
        for i, j in enumerate(self._group):
            dtype = torch.float32 if per_agent.dtype.kind == "f" else torch.long
            out[j] = torch.as_tensor(np.ascontiguousarray(per_agent[:, i]), dtype=dtype, device=device)
        for j, name in zip(self._other, self.others, strict=True):
            noop = np.asarray(self.noop(self._act_spaces[name]))
            out[j] = torch.as_tensor(np.broadcast_to(noop.reshape(-1), (m, max(noop.size, 1))).copy(), device=device)
        return [a for a in out if a is not None]

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        m, n = self.num_copies, self.n_agents
        obs, rew, done, _ = self._call(self.vmas.step, self._vmas_actions(actions))
        rewards = torch.stack([rew[j] for j in self._group], dim=1).detach().to("cpu", torch.float64).numpy()
        other = (torch.stack([rew[j] for j in self._other], dim=1).sum(dim=1).detach().cpu().numpy()
                 if self._other else np.zeros(m))
        done = done.detach().cpu().numpy().astype(bool).reshape(m)
        resets = np.flatnonzero(self._needs_reset)
        if resets.size:  # the reset step after a copy's episode: reset observation, no reward, not done
            for c in resets:
                self._call(self.vmas.reset_at, int(c), return_observations=False)
            obs = self._call(self.vmas.get_from_scenario, get_observations=True, get_rewards=False,
                             get_infos=False, get_dones=False)[0]
            rewards[resets], other[resets], done[resets] = 0.0, 0.0, False
            self._returns[resets], self._other_returns[resets], self._lengths[resets] = 0.0, 0.0, 0
            self._active[resets] = True
            self._needs_reset[resets] = False
        stepped = np.ones(m, bool)
        stepped[resets] = False
        self._lengths[stepped] += 1
        self._returns[stepped] += rewards[stepped]
        self._other_returns[stepped] += other[stepped]
        term = done & stepped
        trunc = stepped & ~term & (self._lengths >= self.max_steps if self.max_steps else False)
        ended = term | trunc
        self._active[term] = False  # joint mode: nothing to bootstrap from (module docstring of envs/multiagent.py)
        self._needs_reset |= ended
        self._write(obs)
        terminated, truncated = np.repeat(term[:, None], n, axis=1), np.repeat(trunc[:, None], n, axis=1)
        return self._outputs(rewards, terminated, truncated, ended)

    def render(self) -> tuple[Any, ...] | None:
        """One rgb_array frame per copy (VMAS draws with pyglet)."""
        return tuple(self._call(self.vmas.render, mode="rgb_array", env_index=c) for c in range(self.num_copies))

    def close_extras(self, **kwargs: Any) -> None:
        viewer = getattr(self.vmas, "viewer", None)
        if viewer is not None:
            viewer.close()

    # exact resume (envs/state.py): the world's tensors and numbers, found by their path from the VMAS env
    def capture_state(self) -> dict[str, Any]:
        paths, values = [], []
        for path, (_, _, value) in _world_leaves(self.vmas).items():
            paths.append(path)
            values.append(value.detach().cpu().clone() if isinstance(value, torch.Tensor) else value)
        return {"paths": paths, "values": values}

    def restore_state(self, state: dict[str, Any]) -> None:
        leaves = _world_leaves(self.vmas)
        for path, value in zip(state["paths"], state["values"], strict=True):
            if path in leaves:
                owner, key, current = leaves[path]
            else:  # made during an episode, after the fresh env's reset
                owner, key, current = _owner(self.vmas, path), _last_key(path), None
            if isinstance(value, torch.Tensor):
                device = self.vmas.device
                if isinstance(current, torch.Tensor) and current.shape == value.shape and current.dtype == value.dtype:
                    try:
                        current.copy_(value)  # in place: tensors the world shares stay shared
                        continue
                    except RuntimeError:  # an expanded view cannot be written in place
                        pass
                value = value.to(device).clone()
            _set(owner, key, value)


_SCALARS = (bool, int, float)
_STRUCTURE = ("viewer", "action_space", "observation_space", "text_lines", "_render_field_function")
_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(-?\d+)\]|\{([^}]*)\}")


def _walkable(value: Any) -> bool:
    """An object of VMAS's world to walk into (its scenario, world, entities, their states and shapes)."""
    if isinstance(value, torch.Tensor | torch.device | type | np.ndarray | str | bytes | enum.Enum) or callable(value):
        return False
    module = type(value).__module__ or ""
    return hasattr(value, "__dict__") and (module.startswith("vmas") or module in ("", "__main__")
                                            or "scenario" in module.lower())


def _world_leaves(env: Any) -> dict[str, tuple[Any, Any, Any]]:
    """Every tensor and number reachable from the VMAS env through its objects, lists and dicts, by path
    (`.attr`, `[index]`, `{key}`), first path wins: {path: (owner, key, value)}. Spaces, rendering and callables are
    structure, rebuilt from the config."""
    leaves: dict[str, tuple[Any, Any, Any]] = {}
    seen: set[int] = set()

    def walk(obj: Any, path: str) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, list | tuple):
            items: Any = [(f"[{i}]", i, v) for i, v in enumerate(obj)]
        elif isinstance(obj, dict):
            items = [(f"{{{k}}}", k, v) for k, v in obj.items() if isinstance(k, str) and "}" not in k]
        else:
            items = [(f".{k}", k, v) for k, v in vars(obj).items() if k not in _STRUCTURE]
        for step, key, value in items:
            if isinstance(value, torch.Tensor):
                if id(value) not in seen:
                    seen.add(id(value))
                    leaves[path + step] = (obj, key, value)
            elif isinstance(value, _SCALARS) and not isinstance(obj, tuple):
                leaves[path + step] = (obj, key, value)
            elif (isinstance(value, list | dict) or (isinstance(value, tuple) and not hasattr(value, "_fields"))
                  or _walkable(value)):
                walk(value, path + step)

    walk(env, "")
    return leaves


def _steps(path: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for attr, index, key in _STEP.findall(path):
        out.append(("attr", attr) if attr else ("index", int(index)) if index else ("key", key))
    return out


def _owner(root: Any, path: str) -> Any:
    obj = root
    for kind, key in _steps(path)[:-1]:
        obj = getattr(obj, key) if kind == "attr" else obj[key]
    return obj


def _last_key(path: str) -> Any:
    return _steps(path)[-1][1]


def _set(owner: Any, key: Any, value: Any) -> None:
    if isinstance(owner, list | dict):
        owner[key] = value
    else:
        setattr(owner, key, value)
