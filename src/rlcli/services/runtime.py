"""Process-wide set-up: device, seeds, threads, determinism."""

from __future__ import annotations

import ctypes
import os
import random
import sys

import numpy as np
import torch

from rlcli.registry import ConfigError


def resolve_device(spec: str) -> torch.device:
    """`auto` picks CUDA when present; an absent or malformed device is a one-line error."""
    spec = str(spec).strip()
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "cuda" or spec.startswith("cuda:"):
        index = spec.partition(":")[2]
        if index and not index.isdigit():
            raise ConfigError(f"device={spec!r} is invalid; choose from: auto, cpu, cuda, cuda:N")
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"device={spec!r} is not available: this machine has no CUDA GPU; choose from: auto, cpu")
        if index and int(index) >= count:
            valid = ", ".join(["auto", "cpu", "cuda"] + [f"cuda:{i}" for i in range(count)])
            raise ConfigError(f"device={spec!r} is not available ({count} CUDA device(s)); choose from: {valid}")
        return torch.device(spec)
    raise ConfigError(f"device={spec!r} is invalid; choose from: auto, cpu, cuda, cuda:N")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask; os.cpu_count() where there is none)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def max_torch_threads() -> int:
    """The most `torch_threads` a run may ask for: 4 per usable core. Threads past the cores only wait for each other
    (even 2x is slower for rlcli's nets), so 4x leaves room for a machine that counts SMT siblings or for an
    experiment, while the thread counts that crash torch's OpenMP pool (100,000 segfaulted at start-up; 5,000 took a
    minute for 256 env steps on 2 cores) are refused."""
    return 4 * usable_cores()


def configure_torch(threads: int, deterministic: bool) -> None:
    """Small nets act fastest on one thread; `deterministic` makes CPU runs bit-reproducible. `threads` is capped at
    `max_torch_threads()` here too (what reads a config without rl-train's check, e.g. a checkpoint's)."""
    reuse_freed_memory()
    if threads > 0:
        torch.set_num_threads(min(threads, max_torch_threads()))
    if deterministic:
        # For the whole process, as the flag below: torch reads it at the process's first cuBLAS call (after this
        # returns: a GPU run's first update) and keeps what it read; put back here, that call would raise
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        set_deterministic(True)
        torch.backends.cudnn.benchmark = False


# glibc's mallopt parameters, and the values a training process sets (its largest mmap threshold)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_BYTES, TRIM_THRESHOLD_BYTES = 32 * 2**20, 128 * 2**20
_malloc_set: list[bool] = []


def reuse_freed_memory() -> bool:
    """Have glibc's malloc keep freed tensor memory for the next step's tensors (True where it was set).

    By default a block over 128 kB gets its own mmap (the threshold rises only as such blocks are freed), and the
    heap's free top goes back to the OS past twice that: every update's larger activations then touch fresh pages,
    each a page fault. An update of 4 PPO CartPole members took ~200 such faults and ~3% longer; a single SAC run's
    [256, 256] update 2-6% longer. Both thresholds are set once per process (mmap: 32 MB, glibc's largest; trim:
    128 MB), as GLIBC_TUNABLES would at its start. Elsewhere (not glibc) nothing changes."""
    if _malloc_set:
        return _malloc_set[0]
    ok = False
    if sys.platform.startswith("linux"):
        try:
            mallopt = ctypes.CDLL(None).mallopt
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
                mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
        except (OSError, AttributeError):  # a C library without mallopt
            ok = False
    _malloc_set.append(ok)
    return ok


def set_deterministic(mode: bool) -> None:
    """torch's deterministic-algorithms flag. `torch.use_deterministic_algorithms` sets inductor's flag too, and to
    reach it imports torch._inductor and torch._dynamo: 1.2 s of every deterministic=true run's start-up here, for
    a flag only compiled code reads. Compiled steps set inductor's flag themselves from this one
    (algos/compiled.before_compiling); a torch without the C setter takes the public call."""
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None:
        torch.use_deterministic_algorithms(mode)
    else:
        setter(mode, warn_only=False)


def seconds_since_process_start() -> float | None:
    """How long this process has existed (Linux /proc; None elsewhere): start-up time as a user feels it."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class DeviceConstants:
    """A few fixed arrays (action bounds) as float32 tensors, copied once to each device that asks:
    acting on a GPU then moves no constants per step, and a traced or exported policy holds them as constants."""

    def __init__(self, *arrays: np.ndarray) -> None:
        self.arrays = tuple(torch.as_tensor(np.asarray(a, dtype=np.float32)) for a in arrays)
        self._copies: dict[torch.device, tuple[torch.Tensor, ...]] = {}

    def on(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        if device not in self._copies:
            self._copies[device] = tuple(a.to(device) for a in self.arrays)
        return self._copies[device]
