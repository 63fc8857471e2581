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
from rlcli.contracts import Algorithm, MaskedPolicy, RecurrentState
from rlcli.envs.masks import mask_width, masks_from_infos


@dataclass
class TestStats:
    returns: np.ndarray
    lengths: np.ndarray

    @property
    def mean_return(self) -> float:
        return float(self.returns.mean())


FrameSink = Callable[[int, np.ndarray], None]


def evaluate(envs: VectorEnv, algo: Algorithm, normalizer: RunningNorm, device: torch.device, seed: int,
             obs_dtype: torch.dtype = torch.float32, carry_size: int = 0, deterministic: bool = True,
             frames: FrameSink | None = None, masks: bool = False) -> TestStats:
    """One episode in each test env with the (by default deterministic) policy and frozen normalization.
    Env i is reset with seed `seed + i`. `frames(i, frame)` receives each env's rendered frames, from the
    first observation to the last (the envs must render rgb_array). `masks`: the algorithm acts among the
    valid actions that the envs' infos give (AlgoSpec.action_masks)."""
    n = envs.num_envs
    returns, lengths = np.zeros(n), np.zeros(n, dtype=np.int64)
    finished = np.zeros(n, dtype=bool)
    n_actions = mask_width(envs.single_action_space) if masks else 0
    obs, infos = envs.reset(seed=seed)
    if frames is not None:
        _pass_frames(envs, finished, frames)
    # one episode per env: a fresh carry at the first step, never reset after it
    state = (RecurrentState(torch.zeros(n, carry_size, device=device), torch.ones(n, device=device))
             if carry_size else None)
    while not finished.all():
        with torch.inference_mode():
            x = normalizer(torch.as_tensor(obs, dtype=obs_dtype, device=device))
            if masks:
                mask = torch.as_tensor(masks_from_infos(infos, n, n_actions), device=device)
                out = cast(MaskedPolicy, algo).act_masked(x, mask, deterministic=deterministic)
            else:
                out = algo.act(x, deterministic=deterministic, state=state)
        if state is not None:
            assert out.carry is not None
            state = RecurrentState(out.carry, torch.zeros(n, device=device))
        obs, _, _, _, infos = envs.step(algo.env_actions(out.actions).cpu().numpy())
        if frames is not None:
            _pass_frames(envs, finished, frames)
        if "_episode" in infos:
            first = infos["_episode"] & ~finished
            returns[first] = infos["episode"]["r"][first]
            lengths[first] = infos["episode"]["l"][first]
            finished |= first
    return TestStats(returns, lengths)


def _pass_frames(envs: VectorEnv, finished: np.ndarray, frames: FrameSink) -> None:
    rendered = envs.render()
    assert rendered is not None, "evaluate(frames=...) needs envs made with render_mode='rgb_array'"
    for i in np.flatnonzero(~finished):
        frames(int(i), rendered[i])
