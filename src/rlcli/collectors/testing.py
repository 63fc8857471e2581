"""A test phase: one episode in each test env with the deterministic policy and frozen normalization (what
the trainer's test phases, rl-eval and the Python API's evaluate run), optionally passing the rendered frames on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch
from gymnasium.vector import VectorEnv

from rlcli.actors.normalizer import RunningNorm
from rlcli.collectors.env_faults import EnvError, timed_out
from rlcli.contracts import Algorithm, MaskedPolicy, RecurrentState
from rlcli.envs.masks import mask_width, masks_from_infos
from rlcli.envs.multiagent import find_attr, group_returns
from rlcli.services.deadlines import DEADLINES, StepTimedOut


@dataclass
class TestStats:
    returns: np.ndarray
    lengths: np.ndarray
    agent_returns: dict[str, np.ndarray] | None = None  # env=pz: each agent's return per episode (returns: the sums)
    team_returns: np.ndarray | None = None  # env=pz: the sum over every agent of the env, those outside the group too
    group_returns: dict[str, np.ndarray] | None = None  # env.groups: each group's sum of its agents' returns

    @property
    def mean_return(self) -> float:
        return float(self.returns.mean())


FrameSink = Callable[[int, np.ndarray], None]


class TestEpisodes:
    """One episode in each of `envs` (env i reset with seed `seed + i`), stepped with the actions the caller
    chose: `evaluate`'s loop, which a population also runs for all its members' test envs at once, acting for all
    of them in one call (sweeps/population/testing.py). `frames(i, frame)`: see `evaluate`."""

    def __init__(self, envs: VectorEnv, seed: int, frames: FrameSink | None = None) -> None:
        self.envs, self.frames = envs, frames
        # env=pz (envs/multiagent.py): one episode per copy of the env, reported on its first row
        rows = find_attr(envs, "episode_rows")
        self.rows = np.arange(envs.num_envs) if rows is None else np.asarray(rows)
        self.agent_names: list[str] = find_attr(envs, "agent_names") if rows is not None else []
        self.agent_groups: dict[str, list[str]] = (find_attr(envs, "agent_groups") or {}) if rows is not None else {}
        n = len(self.rows)
        self.agent_returns = np.zeros((n, len(self.agent_names)))
        self.team_returns = np.zeros(n)
        self.returns, self.lengths = np.zeros(n), np.zeros(n, dtype=np.int64)
        self.finished = np.zeros(n, dtype=bool)
        self.obs, self.infos = envs.reset(seed=seed)
        if frames is not None:
            _pass_frames(envs, self.finished, frames)

    @property
    def done(self) -> bool:
        return bool(self.finished.all())

    def step(self, env_actions: np.ndarray) -> None:
        try:  # train.step_timeout, while a run trains (services/deadlines.py)
            self.obs, _, _, _, self.infos = DEADLINES.call_within_step_deadline(self.envs.step, env_actions)
        except StepTimedOut as late:
            raise EnvError(timed_out(late.seconds, "a test episode's step"), 0) from None
        if self.frames is not None:
            _pass_frames(self.envs, self.finished, self.frames)
        if "_episode" in self.infos:
            first = self.infos["_episode"][self.rows] & ~self.finished
            self.returns[first] = self.infos["episode"]["r"][self.rows][first]
            self.lengths[first] = self.infos["episode"]["l"][self.rows][first]
            if self.agent_names:
                per_agent = self.infos["agent_episode"]["r"].reshape(len(self.rows), len(self.agent_names))
                self.agent_returns[first] = per_agent[first]
                self.team_returns[first] = self.infos["team_episode"]["r"][self.rows][first]
            self.finished |= first

    def stats(self) -> TestStats:
        agents = {name: self.agent_returns[:, i] for i, name in enumerate(self.agent_names)} or None
        groups = group_returns(agents or {}, self.agent_groups) or None
        return TestStats(self.returns, self.lengths, agents, self.team_returns if self.agent_names else None, groups)


def evaluate(envs: VectorEnv, algo: Algorithm, normalizer: RunningNorm, device: torch.device, seed: int,
             obs_dtype: torch.dtype = torch.float32, carry_size: int = 0, deterministic: bool = True,
             frames: FrameSink | None = None, masks: bool = False) -> TestStats:
    """One episode in each test env with the (by default deterministic) policy and frozen normalization.
    Env i is reset with seed `seed + i`. `frames(i, frame)` receives each env's rendered frames, from the
    first observation to the last (the envs must render rgb_array). `masks`: the algorithm acts among the
    valid actions that the envs' infos give (AlgoSpec.action_masks)."""
    n = envs.num_envs
    n_actions = mask_width(envs.single_action_space) if masks else 0
    episodes = TestEpisodes(envs, seed, frames)
    # one episode per env: a fresh carry at the first step, never reset after it
    state = (RecurrentState(torch.zeros(n, carry_size, device=device), torch.ones(n, device=device))
             if carry_size else None)
    while not episodes.done:
        with torch.inference_mode():
            x = normalizer(torch.as_tensor(episodes.obs, dtype=obs_dtype, device=device))
            if masks:
                mask = torch.as_tensor(masks_from_infos(episodes.infos, n, n_actions), device=device)
                out = cast(MaskedPolicy, algo).act_masked(x, mask, deterministic=deterministic)
            else:
                out = algo.act(x, deterministic=deterministic, state=state)
        if state is not None:
            assert out.carry is not None
            state = RecurrentState(out.carry, torch.zeros(n, device=device))
        episodes.step(algo.env_actions(out.actions).cpu().numpy())
    return episodes.stats()


def _pass_frames(envs: VectorEnv, finished: np.ndarray, frames: FrameSink) -> None:
    rendered = envs.render()
    assert rendered is not None, "evaluate(frames=...) needs envs made with render_mode='rgb_array'"
    for i in np.flatnonzero(~finished):
        frames(int(i), rendered[i])
