"""Refuse, before allocating, a run that cannot fit in this machine's memory.

A typo such as `buffer.capacity=10**10` or `actor.hidden_sizes=[100000,100000]` otherwise ends in an
allocation traceback after start-up (or in the kernel's OOM killer much later). The estimate counts
what the run commits: the storage it fills (a replay buffer fills at most train.total_steps of its
capacity; its observation arrays are committed as they fill) and the networks with their gradients
and Adam moments. It is a lower bound, so only runs that surely do not fit are refused.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from rlcli.registry import ConfigError


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (Linux), else physical memory; None when neither is known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def network_bytes(hidden_sizes: Any, obs_elems: int, act_elems: int) -> int:
    """An MLP actor and critic from `hidden_sizes`: weights, gradients and two Adam moments, float32."""
    try:
        sizes = [int(h) for h in hidden_sizes]
    except (TypeError, ValueError):
        return 0
    widths = [obs_elems, *sizes, act_elems]
    params = sum(a * b + b for a, b in zip(widths[:-1], widths[1:], strict=False))
    return 2 * params * 4 * 4


def check_fits(parts: dict[str, int], available: int | None = None) -> None:
    """ConfigError naming the estimate, its largest part and what is available, when it cannot fit."""
    available = available_bytes() if available is None else available
    need = sum(parts.values())
    if available is None or need <= available:
        return
    name, biggest = max(parts.items(), key=lambda item: item[1])
    raise ConfigError(f"this run needs at least {_gib(need)} of memory ({name}: {_gib(biggest)}) and this machine "
                      f"has {_gib(available)} available; lower {name}")


def estimate(cfg: Any, obs_space: Any, act_space: Any, num_envs: int, n_steps: int, on_policy: bool,
             obs_bytes: int) -> dict[str, int]:
    """The memory a run commits, by the setting that drives each part."""
    obs_elems = int(np.prod(obs_space.shape)) if getattr(obs_space, "shape", None) else 1
    act_elems = int(np.prod(act_space.shape)) if getattr(act_space, "shape", None) else 1
    parts = {"actor.hidden_sizes": network_bytes(cfg.actor.get("hidden_sizes", []), obs_elems, act_elems)}
    if on_policy:
        parts["algo.n_steps"] = n_steps * num_envs * (obs_elems * obs_bytes + 4 * (act_elems + 8))
    else:
        capacity = int(cfg.buffer.get("capacity", 0) or 0)
        filled = min(capacity, int(cfg.train.total_steps))
        parts["buffer.capacity"] = capacity * 4 * (act_elems + 2) + filled * 2 * obs_elems * obs_bytes
    return parts
