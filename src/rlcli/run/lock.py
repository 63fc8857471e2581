"""One process per run directory.

Two schedulers that re-queue the same job would otherwise both resume it and write over each other's
checkpoints, `eval.jsonl` and TensorBoard events. The lock is a POSIX record lock (`fcntl.lockf`) on
`<run dir>/.rlcli.lock`: the kernel drops it when the holding process dies, however it dies, so a
killed run never blocks the next start, and NFS (v4, or v3 with lockd) carries the same locks between
hosts. The file itself only says who holds it (pid, host, start time), for the error message.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from pathlib import Path

from rlcli.registry import ConfigError

LOCK_NAME = ".rlcli.lock"
_held: dict[Path, int] = {}  # run dir -> the open descriptor that holds its lock


class RunDirInUse(ConfigError):
    """Another live process holds the run directory."""


def acquire(run_dir: Path) -> None:
    """Hold `run_dir` for this process (a no-op if it already does); RunDirInUse names the holder."""
    run_dir = Path(run_dir).resolve()
    if run_dir in _held:
        return
    path = run_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise ConfigError(f"cannot lock the run directory {run_dir}: {error.strerror} ({path})") from None
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 512, 0).decode(errors="replace").split()
        os.close(fd)
        who = (f"pid {holder[0]} on host {holder[1]}, since {' '.join(holder[2:])}" if len(holder) >= 3
               else "another process")
        raise RunDirInUse(f"{run_dir} is in use by another rl-train ({who}); one process per run directory: "
                          "wait for it to end or stop it first") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {socket.gethostname()} {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
    _held[run_dir] = fd


def release(run_dir: Path) -> None:
    """Let another process have `run_dir` (a sweep's job ends but its process goes on)."""
    fd = _held.pop(Path(run_dir).resolve(), None)
    if fd is not None:
        os.close(fd)  # closing the descriptor drops its lock; the file stays, harmless


def remove_stale_temporaries(run_dir: Path) -> None:
    """`*.tmp` files that a killed process left behind (a write is a temporary file, then a rename)."""
    for stale in [*run_dir.glob("*.tmp"), *run_dir.glob("checkpoints/*.tmp")]:
        with contextlib.suppress(OSError):
            stale.unlink()
