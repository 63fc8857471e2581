"""Checkpoint files: written atomically (temporary file, fsync, rename), the last K kept."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT_VERSION = 1


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def save(directory: Path, env_steps: int, payload: dict[str, Any], keep: int) -> Path:
    """Write `ckpt_<env steps>.pt` so that a crash mid-write never leaves a partial file in place."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"ckpt_{env_steps:012d}.pt"
    tmp = path.with_suffix(".pt.tmp")
    with open(tmp, "wb") as f:
        torch.save({"format_version": FORMAT_VERSION, "env_steps": env_steps, **payload}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    for old in sorted(directory.glob("ckpt_*.pt"))[:-keep]:
        old.unlink()
    return path


def load(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint written by `save` (weights, optimizer, counters, config)."""
    data = torch.load(path, map_location=map_location, weights_only=False)
    if data.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path}: checkpoint format {data.get('format_version')!r}, expected {FORMAT_VERSION}")
    return data


def latest(directory: Path) -> Path | None:
    files = sorted(directory.glob("ckpt_*.pt"))
    return files[-1] if files else None
