"""PettingZoo AEC (turn-based) envs as one gymnasium VectorEnv with a row per player (`env=pz` with an AEC env).

Self-play: M copies of a game with N players become M * N rows, copy c's player i (`possible_agents[i]`) at row
c * N + i, one network shared by the players, as envs/multiagent.py does for Parallel envs (the player's one-hot
index appended with `env.agent_id`). Each vector step moves every copy once: the row of the player to move acts, the
other rows of the copy wait (their actions are ignored). `info["rlcli_acting"]` says, for the observations just
returned, which rows act at them; the on-policy collector stores nothing at a waiting step (valid = 0) and the
rollout's GAE (buffers/rollout.py) folds the waiting steps into the player's transition before them, so a player's
transition goes from one of its turns to its next turn with no extra discount, the other players' moves between
being part of its env.

Rewards follow PettingZoo's `last()`: what a player receives since its last turn (`_cumulative_rewards`, zeroed when
it acts), given on its row at the step it arrives; the sum over a transition's steps is what `last()` would say at
the player's next turn. When the game ends every player's row reports its final reward and its own flag at that
step, terminated or truncated as PettingZoo says (the loser gets its -1 though the winner moved last), and every
row's final observation is a decision point (`acting`); the copy's next step is its reset step (NEXT_STEP
autoreset). A player that ends while the game goes on (eliminated) reports its flag on every later step of the copy,
as Parallel agents do.

Masks: the classic games' Dict observation {"observation", "action_mask"} (the network sees the observation) or
`info["action_mask"]`; `info["action_mask"]` holds the acting row's mask and, for a waiting row, no valid action
(which envs/masks.py reads as "any": the action is ignored).

Returns: a copy's episode return is the sum over its players (0 in a zero-sum game; never divided), each player's
own under `agent_episode` (rollout/return_<player>). Test envs (`eval`) play the policy against a uniformly random
player over the legal moves instead: one row per copy, the policy in seat c mod N of copy c, the other players moved
inside the step, and the episode return is the policy's own (win - loss rate in a +1/-1 game).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from rlcli.registry import ConfigError

MASK_KEY = "action_mask"
# the rows that act at the observations a step returned; named so that no other env's info sets it by chance
ACTING_KEY = "rlcli_acting"


def is_turn_based(env: Any) -> bool:
    """Whether a PettingZoo env is an AEC (turn-based) one."""
    from pettingzoo import AECEnv

    return isinstance(env, AECEnv) or hasattr(env, "agent_selection")


def check_turn_based(env_id: str, algo: str, spec: Any, actor: str) -> None:
    """What a run on a turn-based env needs, in one line before any env is made: an on-policy algorithm (a player's
    transition spans the other players' moves: the rollout's GAE folds them in, a replay cannot), a feed-forward
    actor (a carry would step through the waiting steps)."""
    from rlcli.registry import ACTORS, ALGOS

    if not spec.on_policy:
        able = [n for n in ALGOS.names() if ALGOS.spec(n).on_policy and ALGOS.spec(n).action_masks]
        raise ConfigError(f"algo={algo} is off-policy; env {env_id} is turn-based, whose players' transitions span "
                          f"the other players' moves, which only the on-policy rollout stores: use algo="
                          f"{', '.join(able)} (or ppo, where the env has no action masks)")
    if not spec.rollout_returns:
        able = [n for n in ALGOS.names() if ALGOS.spec(n).on_policy and ALGOS.spec(n).rollout_returns]
        raise ConfigError(f"algo={algo} computes its own returns from the rollout, which on turn-based env {env_id} "
                          f"would not span the other players' moves; use algo={', '.join(able)}")
    if ACTORS.spec(actor).recurrent:
        raise ConfigError(f"actor={actor} is recurrent; env {env_id} is turn-based, which recurrent actors do not "
                          "take yet (the carry would step through the other players' moves): use actor=mlp")


class TurnBasedVectorEnv(VectorEnv):
    """M copies of a PettingZoo AECEnv as a VectorEnv of M * N rows, or (`vs_random`: test envs) M rows, each the
    policy against uniformly random players (module docstring). Copy c is reset with seed `seed + c * rows_per_copy`."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}
    state_capturable = True

    def __init__(self, copies: list[Any], env_id: str, agent_id: bool, vs_random: bool = False) -> None:
        first = copies[0]
        self.copies, self.env_id, self.vs_random = copies, env_id, vs_random
        self.spec = SimpleNamespace(id=env_id)  # type: ignore[assignment]  # what messages name the env by
        players = list(first.possible_agents)
        obs_space, act_space = first.observation_space(players[0]), first.action_space(players[0])
        for name in players[1:]:
            if first.observation_space(name) != obs_space or first.action_space(name) != act_space:
                raise ConfigError(f"env {env_id}: player {name!r} has other spaces than {players[0]!r}; one policy "
                                  "plays every player of a turn-based env, so they must share spaces")
        if not isinstance(act_space, gym.spaces.Discrete):
            raise ConfigError(f"env {env_id}: turn-based envs take Discrete actions; {players[0]!r} has {act_space}")
        self.dict_obs = isinstance(obs_space, gym.spaces.Dict)
        if self.dict_obs:
            assert isinstance(obs_space, gym.spaces.Dict)
            if "observation" not in obs_space.spaces:
                raise ConfigError(f"env {env_id}: its Dict observations have no 'observation' entry (keys: "
                                  f"{', '.join(obs_space.spaces)}); turn-based envs take a Box or "
                                  "{'observation', 'action_mask'}")
            obs_space = obs_space.spaces["observation"]
        if not isinstance(obs_space, gym.spaces.Box):
            raise ConfigError(f"env {env_id}: player {players[0]!r} has {obs_space} observations; env=pz takes Box "
                              "ones (or {'observation': Box, 'action_mask'})")
        self.agent_names, self.players = ([] if vs_random else players), players
        self.n_players, self.num_copies = len(players), len(copies)
        self.rows_per_copy = 1 if vs_random else self.n_players
        self.num_envs = self.num_copies * self.rows_per_copy
        self.n_actions = int(act_space.n)
        self.own_size = int(np.prod(obs_space.shape))
        self.agent_id = agent_id
        size = self.own_size + (self.n_players if agent_id else 0)
        low, high = np.zeros(size, np.float32), np.ones(size, np.float32)
        low[:self.own_size] = np.asarray(obs_space.low, np.float32).reshape(-1)
        high[:self.own_size] = np.asarray(obs_space.high, np.float32).reshape(-1)
        self.single_observation_space = gym.spaces.Box(low, high, dtype=np.float32)
        self.single_action_space = act_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.episode_rows = np.arange(self.num_copies) * self.rows_per_copy
        m, n = self.num_copies, self.n_players
        self.has_masks = self.dict_obs or self._info_mask(first) is not None
        self._obs = np.zeros((m, n, size), np.float32)  # every player's view; vs_random rows read the seat's
        if agent_id:
            self._obs[:, :, self.own_size:] = np.eye(n, dtype=np.float32)
        self._masks = np.zeros((m, n, self.n_actions), bool)
        self._acting = np.zeros((m, n), bool)
        self._alive = np.zeros((m, n), bool)
        self._ended_by_termination = np.zeros((m, n), bool)
        self._seen = np.zeros((m, n))  # each player's _cumulative_rewards as last read
        self._needs_reset = np.zeros(m, bool)
        self._returns = np.zeros((m, n))
        self._lengths = np.zeros(m, np.int64)
        self.seats = np.arange(m) % n  # vs_random: the policy's player in each copy
        self._rng = [np.random.default_rng(c) for c in range(m)]  # vs_random: the random players' moves

    def _info_mask(self, env: Any) -> np.ndarray | None:
        env.reset(seed=0)  # a run's first reset reseeds it
        info = env.infos.get(env.agent_selection, {}) if hasattr(env, "infos") else {}
        return info.get(MASK_KEY) if isinstance(info, dict) else None

    # -- one copy ----------------------------------------------------------------------------------------------
    def _read(self, c: int) -> None:
        """Copy c's observations, masks and who acts, after its last change."""
        env = self.copies[c]
        live = set(env.agents)
        selected = env.agent_selection if live else None
        for i, name in enumerate(self.players):
            self._masks[c, i] = False
            if name not in live:
                continue
            obs = env.observe(name)
            mask = None
            if self.dict_obs:
                mask, obs = obs[MASK_KEY], obs["observation"]
            elif self.has_masks:
                mask = env.infos.get(name, {}).get(MASK_KEY)
            self._obs[c, i, :self.own_size] = np.asarray(obs, np.float32).reshape(-1)
            if name == selected and self._alive[c, i] and mask is not None:
                self._masks[c, i] = np.asarray(mask, bool).reshape(-1)
        # who acts at these observations: the player to move; rows that ended are decision points that store nothing
        self._acting[c] = ~self._alive[c]
        if selected is not None and selected in self.players:
            self._acting[c, self.players.index(selected)] = True

    def _reset_copy(self, c: int, seed: int | None) -> np.ndarray:
        """Reset copy c; vs_random: also the random players' moves up to the seat's first turn (their rewards)."""
        env = self.copies[c]
        env.reset(seed=seed)
        if seed is not None:
            self._rng[c] = np.random.default_rng(seed)
        self._alive[c] = [name in env.agents for name in self.players]
        self._ended_by_termination[c] = False
        self._needs_reset[c] = False
        self._returns[c] = 0.0
        self._lengths[c] = 0
        self._seen[c] = 0.0
        rewards = np.zeros(self.n_players)
        self._read(c)
        if self.vs_random:
            rewards += self._play_others(c)
            self._returns[c] += rewards
        return rewards

    def _rewards_since(self, c: int) -> np.ndarray:
        """What each player received since the last reading (PettingZoo's _cumulative_rewards, per player)."""
        raw = self.copies[c].unwrapped
        cumulative = getattr(raw, "_cumulative_rewards", None)
        if cumulative is None:  # an env that keeps no running count: its `rewards`, the last step's
            return np.array([float(raw.rewards.get(name, 0.0)) for name in self.players])
        now = np.array([float(cumulative.get(name, self._seen[c, i])) for i, name in enumerate(self.players)])
        got: np.ndarray = now - self._seen[c]
        self._seen[c] = now
        return got

    def _move(self, c: int, action: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Copy c's player to move plays `action`; then players that ended leave as PettingZoo asks (step(None)).
        Each player's reward of this move, and who ended with it (terminated, truncated)."""
        env = self.copies[c]
        raw = env.unwrapped
        mover = env.agent_selection
        i = self.players.index(mover)
        # last() gave the mover everything since its last turn: its count starts again (PettingZoo's step does the
        # same; an env that leaves it to the end of the game gets it here)
        if getattr(raw, "_cumulative_rewards", None) is not None:
            raw._cumulative_rewards[mover] = 0.0
        self._seen[c, i] = 0.0
        env.step(action)
        self._lengths[c] += 1
        rewards = self._rewards_since(c)
        terminated, truncated = np.zeros(self.n_players, bool), np.zeros(self.n_players, bool)
        for j, name in enumerate(self.players):
            if not self._alive[c, j]:
                continue
            t = bool(env.terminations.get(name, False)) if name in env.agents else False
            u = bool(env.truncations.get(name, False)) if name in env.agents else name not in env.agents
            if t or u:
                self._alive[c, j] = False
                self._ended_by_termination[c, j] = t
                terminated[j], truncated[j] = t, u and not t
        self._read(c)  # the observations as the move left them (the final ones, where it ended the game)
        while env.agents and (env.terminations.get(env.agent_selection) or env.truncations.get(env.agent_selection)):
            env.step(None)  # a player that ended leaves at its turn
        self._read(c)  # who moves now (the players still in the game keep their observations up to date)
        return rewards, terminated, truncated

    def _play_others(self, c: int) -> np.ndarray:
        """vs_random: the other players' uniformly random legal moves until the seat's turn or the game's end."""
        env, seat = self.copies[c], self.players[self.seats[c]]
        rewards = np.zeros(self.n_players)
        while env.agents and self._alive[c, self.seats[c]] and env.agent_selection != seat:
            name = env.agent_selection
            obs = env.observe(name)
            mask = (obs[MASK_KEY] if self.dict_obs else env.infos.get(name, {}).get(MASK_KEY)) \
                if self.has_masks else None
            legal = np.flatnonzero(np.asarray(mask, bool)) if mask is not None else np.arange(self.n_actions)
            got, _, _ = self._move(c, int(self._rng[c].choice(legal)) if len(legal) else 0)
            rewards += got
        return rewards

    # -- the vector env ----------------------------------------------------------------------------------------
    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        for c in range(self.num_copies):
            if isinstance(seed, list):
                copy_seed = seed[c * self.rows_per_copy]
            else:
                copy_seed = None if seed is None else seed + c * self.rows_per_copy
            self._reset_copy(c, copy_seed)
        return self._observations(), self._infos()

    def _observations(self) -> np.ndarray:
        if self.vs_random:
            return self._obs[np.arange(self.num_copies), self.seats].copy()
        return self._obs.reshape(self.num_envs, -1).copy()

    def _infos(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        if self.vs_random:
            rows = np.arange(self.num_copies), self.seats
            infos = {MASK_KEY: self._masks[rows].copy()}
        else:
            infos = {MASK_KEY: self._masks.reshape(self.num_envs, -1).copy(),
                     ACTING_KEY: self._acting.reshape(-1).copy()}
        return {**infos, **(extra or {})}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        m, n = self.num_copies, self.n_players
        actions = np.asarray(actions).reshape(-1)
        rewards = np.zeros((m, n))
        terminated = np.zeros((m, n), bool)
        truncated = np.zeros((m, n), bool)
        ended = np.zeros(m, bool)
        for c, env in enumerate(self.copies):
            if self._needs_reset[c]:  # the reset step after the copy's episode: no reward, no row done
                self._reset_copy(c, None)
                continue
            if self.vs_random and not self._alive[c, self.seats[c]]:  # the others ended the game before the seat
                seat = self.seats[c]  # could move (in its opening): the episode ends here, the action unused
                terminated[c, seat] = self._ended_by_termination[c, seat]
                truncated[c, seat] = not terminated[c, seat]
                self._needs_reset[c] = ended[c] = True
                continue
            was_alive = self._alive[c].copy()
            mover = self.players.index(env.agent_selection)
            got, terminated[c], truncated[c] = self._move(c, int(actions[c if self.vs_random else c * n + mover]))
            rewards[c] = got
            if self.vs_random:
                rewards[c] += self._play_others(c)
            for j in np.flatnonzero(~was_alive):  # ended earlier: its flag again, so the collector stores nothing
                terminated[c, j] = self._ended_by_termination[c, j]
                truncated[c, j] = not self._ended_by_termination[c, j]
            self._returns[c] += rewards[c]
            copy_ends = not env.agents or not self._alive[c].any() or (self.vs_random
                                                                       and not self._alive[c, self.seats[c]])
            if self.vs_random and copy_ends:  # the seat's own flag (the game may have ended on another's move)
                seat = self.seats[c]
                terminated[c, seat] = self._ended_by_termination[c, seat]
                truncated[c, seat] = not terminated[c, seat]
            if copy_ends:
                self._acting[c] = True  # the final observations: every row's decision point (a truncation's bootstrap)
                self._masks[c] = False
                self._needs_reset[c] = True
                ended[c] = True
        return self._step_output(rewards, terminated, truncated, ended)

    def _step_output(self, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, ended: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        m, n = self.num_copies, self.n_players
        if self.vs_random:
            rows = np.arange(m), self.seats
            infos = {}
            if ended.any():
                infos = {"episode": {"r": self._returns[rows].copy(), "l": self._lengths.copy()},
                         "_episode": ended.copy()}
            return (self._observations(), rewards[rows], terminated[rows], truncated[rows], self._infos(infos))
        extra: dict[str, Any] = {}
        if ended.any():
            team = np.zeros((m, n))
            team[:, 0] = self._returns.sum(axis=1)  # the sum over the players, never divided (0 in zero-sum games)
            rows_ended = np.zeros((m, n), bool)
            rows_ended[:, 0] = ended
            lengths = np.zeros((m, n), np.int64)
            lengths[:, 0] = self._lengths
            extra = {"episode": {"r": team.reshape(-1), "l": lengths.reshape(-1)}, "_episode": rows_ended.reshape(-1),
                     "agent_episode": {"r": self._returns.reshape(-1).copy()},
                     "team_episode": {"r": team.reshape(-1).copy()}, "_agent_episode": np.repeat(ended, n)}
        return (self._observations(), rewards.reshape(-1), terminated.reshape(-1), truncated.reshape(-1),
                self._infos(extra))

    def render(self) -> tuple[Any, ...] | None:
        """One frame per copy (envs made with render_mode='rgb_array')."""
        return tuple(env.render() for env in self.copies)

    def close_extras(self, **kwargs: Any) -> None:
        for env in self.copies:
            env.close()
