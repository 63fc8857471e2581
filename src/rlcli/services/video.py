"""Videos of a policy: episodes rendered headless (rgb_array) and encoded by imageio.

imageio with imageio-ffmpeg (which ships its own ffmpeg binary) writes mp4; imageio with Pillow
writes gif. Both come with `pip install -e '.[video]'`. Frames stream to the encoder as they are
rendered, so a long episode does not sit in memory (a gif is the exception: Pillow encodes it at the end).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from rlcli.registry import ConfigError

VideoFormat = Literal["mp4", "gif"]
FORMATS: tuple[VideoFormat, ...] = ("mp4", "gif")
TENSORBOARD_WIDTH = 200


@dataclass
class Recording:
    path: Path
    episode_return: float
    length: int
    frames: int


def require_encoder(fmt: str, key: str = "video_format") -> None:
    """A one-line error, before anything runs, when the format is unknown or its encoder is missing."""
    if fmt not in FORMATS:
        raise ConfigError(f"{key}={fmt!r} is invalid; choose from: {', '.join(FORMATS)}")
    import importlib.util

    needed = ["imageio", "imageio_ffmpeg"] if fmt == "mp4" else ["imageio", "PIL"]
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"{key}={fmt} needs {', '.join(missing)}: pip install -e '.[video]'")


def check_draws(envs: Any, asked: str) -> None:
    """One frame now, before anything is trained or written, not a crash at the first video (pyglet without a
    display: LBF's and RWARE's drawing). Each video's episode is reset with its own seed, so this reset changes
    none of them. The envs are closed when they cannot draw."""
    doing = "reset"
    try:
        envs.reset(seed=0)
        doing = "draw a frame"
        envs.render()
    except Exception as error:  # noqa: BLE001  (whatever the env's reset or drawing raises)
        envs.close()
        if isinstance(error, ConfigError):
            raise ConfigError(f"{asked}: {error}") from None
        detail = (str(error).strip().splitlines() or [type(error).__name__])[-1]
        raise ConfigError(f"{asked}: the env could not {doing} ({type(error).__name__}: {detail})"
                          + ("; run without video" if doing != "reset" else "")) from None


def frames_per_second(envs: Any) -> float:
    """The env's own render rate, over the frames it skips per step (Atari's preprocessing: 4)."""
    env = getattr(envs.unwrapped, "envs", [envs])[0]  # the first sub-env, outermost wrapper (or a numpy vector env)
    fps = float(env.metadata.get("render_fps") or 30)
    try:
        skip = int(env.get_wrapper_attr("frame_skip"))
    except AttributeError:
        skip = 1
    return max(1.0, fps / max(1, skip))


class _Writer:
    """One video file, written frame by frame."""

    def __init__(self, path: Path, fmt: VideoFormat, fps: float) -> None:
        import imageio.v2 as imageio

        self.path, self.frames = path, 0
        if fmt == "mp4":
            # quality 7 of 10 keeps CartPole's lines sharp at ~20 kB a second; macro_block_size 2 keeps any
            # even frame size as it is (the encoder needs even sizes; odd ones get scaled by a pixel)
            self.writer = imageio.get_writer(path, format="FFMPEG", mode="I", fps=fps, codec="libx264",
                                             quality=7, macro_block_size=2, ffmpeg_log_level="error")
        else:
            self.writer = imageio.get_writer(path, format="GIF", mode="I", duration=1000.0 / fps, loop=0)

    def add(self, frame: np.ndarray) -> None:
        self.writer.append_data(np.ascontiguousarray(frame))
        self.frames += 1

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class VideoSink:
    """Receives `evaluate`'s frames (its `frames` argument) for the first `count` envs and writes one file per
    episode, `<prefix>-ep<i>-return<R>.<fmt>`, or with `concat` one file of them all, one after another.
    `keep_every` > 0 also keeps every k-th frame of episode 0 in `kept`, shrunk to at most TENSORBOARD_WIDTH
    pixels wide (TensorBoard's copy)."""

    def __init__(self, directory: Path, prefix: str, fmt: VideoFormat, fps: float, count: int,
                 concat: bool = False, keep_every: int = 0) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory, self.prefix, self.fmt, self.count, self.concat = directory, prefix, fmt, count, concat
        self.keep_every, self.kept = keep_every, []
        partial = [directory / f".{prefix}-ep{i}.part.{fmt}" for i in range(count)]
        self.writers = [_Writer(partial[0], fmt, fps)] if concat else [_Writer(p, fmt, fps) for p in partial]
        self.later: list[list[np.ndarray]] = [[] for _ in range(count)]  # concat: episodes after the first
        self.counts = [0] * count

    def __call__(self, i: int, frame: np.ndarray) -> None:
        if i >= self.count:
            return
        self.counts[i] += 1
        if self.keep_every and i == 0 and (self.counts[0] - 1) % self.keep_every == 0:
            stride = max(1, math.ceil(frame.shape[1] / TENSORBOARD_WIDTH))
            self.kept.append(np.ascontiguousarray(frame[::stride, ::stride]))  # small: 1/stride² of the memory
        if not self.concat:
            self.writers[i].add(frame)
        elif i == 0:
            self.writers[0].add(frame)
        else:
            self.later[i].append(frame)

    def close(self) -> None:
        for writer in self.writers:
            writer.close()

    def finish(self, returns: np.ndarray, lengths: np.ndarray) -> list[Recording]:
        """Close the files and name them by their returns."""
        if self.concat:
            for frames in self.later[1:]:
                for frame in frames:
                    self.writers[0].add(frame)
        self.close()
        if self.concat:
            mean = float(returns[: self.count].mean())
            path = self.directory / f"{self.prefix}-ep0-{self.count - 1}-return{_fmt(mean)}.{self.fmt}"
            self.writers[0].path.replace(path)
            return [Recording(path, mean, int(lengths[: self.count].sum()), sum(self.counts))]
        recordings = []
        for i, writer in enumerate(self.writers):
            path = self.directory / f"{self.prefix}-ep{i}-return{_fmt(float(returns[i]))}.{self.fmt}"
            writer.path.replace(path)
            recordings.append(Recording(path, float(returns[i]), int(lengths[i]), writer.frames))
        return recordings


def _fmt(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 100 or value == math.floor(value) else f"{value:.2f}"


def add_to_tensorboard(writer: Any, tag: str, frames: list[np.ndarray], step: int, fps: float) -> None:
    """An animated gif as a TensorBoard image (its Images tab plays it). torch's add_video would need
    moviepy; imageio (the video extra) encodes the same gif."""
    import io

    import imageio.v2 as imageio
    from tensorboard.compat.proto.summary_pb2 import Summary

    buffer = io.BytesIO()
    imageio.mimwrite(buffer, frames, format="GIF", duration=1000.0 / fps, loop=0)
    height, width = frames[0].shape[:2]
    image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=buffer.getvalue())
    writer.file_writer.add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), step)
