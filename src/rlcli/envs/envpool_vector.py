"""`train.vector_mode=envpool`: EnvPool's C++ thread pool behind gymnasium's VectorEnv interface.

EnvPool steps all sub-envs in C++ threads and already uses the autoreset rlcli relies on (NEXT_STEP: the
step after an episode ends is a reset step, reward 0, whose action is ignored), so the adapter only
renames: the wrappers rlcli puts on every vector env (episode statistics, reward scaling, observation
selection) go on top unchanged. Atari ids take EnvPool's own preprocessing with the settings of
rlcli's `env.atari=true` (30 no-op starts, 4-frame skip with max-pooling, 84 x 84 grayscale, episodes end
with the game, ALE v5's sticky actions) and `env.frame_stack`.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from rlcli.registry import ConfigError, did_you_mean


def envpool_task(env_id: str) -> str:
    """EnvPool's name for a gymnasium id (`ALE/Pong-v5` is `Pong-v5`), or a one-line ConfigError."""
    try:
        import envpool
    except ImportError:
        raise ConfigError("train.vector_mode=envpool needs EnvPool: pip install -e '.[envpool]' (Linux, "
                          "Python 3.11+)") from None
    task = env_id.split("/", 1)[1] if env_id.startswith("ALE/") else env_id
    known = set(envpool.list_all_envs())
    if task not in known:
        raise ConfigError(f"train.vector_mode=envpool: EnvPool has no {env_id!r}"
                          f"{did_you_mean(task, sorted(known))}; use train.vector_mode=auto for it "
                          "(EnvPool covers classic control, Box2D, MuJoCo and Atari)")
    return task


def atari_settings(frame_stack: int) -> dict[str, Any]:
    """EnvPool's Atari options equal to rlcli's env.atari=true (gymnasium's AtariPreprocessing on ALE v5)."""
    return {"episodic_life": False, "reward_clip": False, "noop_max": 30, "frame_skip": 4, "img_height": 84,
            "img_width": 84, "gray_scale": True, "stack_num": frame_stack, "repeat_action_probability": 0.25,
            "use_fire_reset": False}


class EnvPoolVectorEnv(VectorEnv):  # type: ignore[misc]
    """`num_envs` sub-envs of one EnvPool task. EnvPool seeds at construction (sub-env i gets seed + i, as
    gymnasium's vector reset does), so `reset(seed=s)` builds the pool again with seed s."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}
    state_capturable = False  # the sub-envs live in C++: a resume resets them (run_state says so)

    def __init__(self, task: str, num_envs: int, options: dict[str, Any]) -> None:
        self.task, self.num_envs, self.options = task, num_envs, dict(options)
        self._pool = self._make(seed=0)
        with warnings.catch_warnings():  # EnvPool's float64 bounds on float32 Boxes: gymnasium warns each time
            warnings.simplefilter("ignore")
            self.single_observation_space = self._pool.observation_space
            self.single_action_space = self._pool.action_space
            self.observation_space = batch_space(self.single_observation_space, num_envs)
            self.action_space = batch_space(self.single_action_space, num_envs)
        self.render_mode = None
        self.closed = False

    def _make(self, seed: int) -> Any:
        import envpool

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return envpool.make_gymnasium(self.task, num_envs=self.num_envs, seed=seed, **self.options)

    def reset(self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        if seed is not None:
            self._pool.close()
            self._pool = self._make(seed=int(seed if isinstance(seed, int) else seed[0]))
        obs, info = self._pool.reset()
        return obs, _plain(info)

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        obs, rewards, terminated, truncated, info = self._pool.step(np.asarray(actions))
        return obs, rewards.astype(np.float64), terminated, truncated, _plain(info)

    def close_extras(self, **kwargs: Any) -> None:
        self._pool.close()


def _plain(info: dict[str, Any]) -> dict[str, Any]:
    """EnvPool's per-step info without its nested `players` table (per-agent ids rlcli has no use for)."""
    return {k: v for k, v in info.items() if k != "players"}


def make_envpool(env_id: str, num_envs: int, *, atari: bool, frame_stack: int, max_episode_steps: int | None,
                 kwargs: dict[str, Any]) -> VectorEnv:
    task = envpool_task(env_id)
    given = {k: v for k, v in kwargs.items() if not (atari and k == "frameskip")}  # rlcli's own Atari default
    if given:
        raise ConfigError(f"train.vector_mode=envpool does not take env.kwargs ({given}): EnvPool's options differ "
                          "from the gymnasium env's; use train.vector_mode=auto with env.kwargs")
    if env_id.startswith("ALE/") and not atari:
        raise ConfigError(f"train.vector_mode=envpool runs {env_id} with the Atari preprocessing only: set "
                          "env.atari=true (the shipped ALE configs do), or use train.vector_mode=auto")
    if frame_stack > 1 and not atari:
        raise ConfigError("train.vector_mode=envpool stacks frames only for Atari (env.atari=true); use "
                          "train.vector_mode=auto with env.frame_stack")
    options: dict[str, Any] = atari_settings(frame_stack) if atari else {}
    if max_episode_steps is not None:
        options["max_episode_steps"] = max_episode_steps
    return EnvPoolVectorEnv(task, num_envs, options)

