"""Preprocessing for image envs other than Atari (CarRacing as RL-Zoo runs it): skip frames, resize, gray
scale, and frame stacks that stay channels-last images the convolutional actor reads."""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from rlcli.registry import ConfigError


class FrameSkip(gym.Wrapper):  # type: ignore[type-arg]
    """Repeat each action `skip` times and sum the rewards; the observation is the last frame (RL-Zoo's
    rl_zoo3.wrappers.FrameSkip: no max-pooling, unlike Atari's). Stops early when the episode ends."""

    def __init__(self, env: gym.Env, skip: int) -> None:  # type: ignore[type-arg]
        super().__init__(env)
        self.skip = skip

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        total = 0.0
        for _ in range(self.skip):
            obs, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            if terminated or truncated:
                break
        return obs, total, terminated, truncated, info


class StackedChannelsLast(gym.ObservationWrapper):  # type: ignore[type-arg]
    """[n, H, W, C] stacked frames -> one [H, W, n * C] image, oldest frame's channels first (SB3's
    VecFrameStack on channels-last images), so the stack is an image the convolutions read."""

    def __init__(self, env: gym.Env) -> None:  # type: ignore[type-arg]
        super().__init__(env)
        space = env.observation_space
        assert isinstance(space, gym.spaces.Box) and len(space.shape) == 4
        self.observation_space = gym.spaces.Box(self._merge(space.low), self._merge(space.high), dtype=space.dtype)

    @staticmethod
    def _merge(frames: np.ndarray) -> np.ndarray:
        n, height, width, channels = frames.shape
        return np.moveaxis(frames, 0, 2).reshape(height, width, n * channels)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return self._merge(np.asarray(observation))


def image_wrappers(env_id: str, frame_skip: int, resize: list[int] | None, grayscale: bool,
                   frame_stack: int) -> list[Any]:
    """The per-env wrappers for `env.frame_skip`, `env.resize` ([height, width]), `env.grayscale` and
    `env.frame_stack`, in RL-Zoo's order; each checks the observations it gets in one line when it wraps."""
    wrappers: list[Any] = []
    if frame_skip > 1:
        wrappers.append(lambda env: FrameSkip(env, frame_skip))
    if resize is not None:
        if len(resize) != 2 or not all(int(x) > 0 for x in resize):
            raise ConfigError(f"env.resize={list(resize)} is invalid: use [height, width], both > 0 (or null)")
        try:
            import cv2  # noqa: F401  (gymnasium's ResizeObservation resizes with it)
        except ImportError:
            raise ConfigError("env.resize needs opencv: pip install -e '.[atari]'") from None
        shape = (int(resize[0]), int(resize[1]))
        wrappers.append(lambda env: gym.wrappers.ResizeObservation(_image(env, env_id, "env.resize"), shape))
    if grayscale:
        wrappers.append(lambda env: gym.wrappers.GrayscaleObservation(_rgb(env, env_id), keep_dim=True))
    if frame_stack > 1:
        wrappers.append(lambda env: stack_frames(env, frame_stack))
    return wrappers


def _image(env: gym.Env, env_id: str, key: str) -> gym.Env:  # type: ignore[type-arg]
    space = env.observation_space
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 3 or space.shape[-1] not in (1, 3, 4):
        raise ConfigError(f"{key} needs channels-last image observations [H, W, C]; {env_id} has {space}")
    return env


def _rgb(env: gym.Env, env_id: str) -> gym.Env:  # type: ignore[type-arg]
    space = _image(env, env_id, "env.grayscale").observation_space
    if space.shape[-1] != 3:  # type: ignore[index]
        raise ConfigError(f"env.grayscale=true needs RGB observations (3 channels); {env_id} has {space}")
    return env


def stack_frames(env: gym.Env, n: int) -> gym.Env:  # type: ignore[type-arg]
    """The last n observations: channels-last images become one image of n * C channels (frames before the
    first are zeros, as SB3's VecFrameStack); other observations (Atari's 2-D frames) get a new first axis."""
    space = env.observation_space
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 3 and space.shape[-1] < space.shape[0]:
        return StackedChannelsLast(gym.wrappers.FrameStackObservation(env, n, padding_type="zero"))
    return gym.wrappers.FrameStackObservation(env, n)
