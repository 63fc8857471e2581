"""Inductor's check that its compiled code for each of the CPU's vector instruction sets loads, answered from disk
once one process has made it.

At a process's first compiled CPU kernel, inductor builds a small probe library for each instruction set the CPU
reports (AVX2, AVX-512, VNNI, ...; the builds are cached on disk, keyed by compiler, flags and torch version) and
then starts a child Python process per probe that only loads it (not cached: every process again). Here that was
six children, each loading libtorch, 0.9-1.1 s of every compile=true process's first step (a single run's, and each
population worker's). Whether a given library file loads does not change while the file does not, so after a
child has loaded it, a note beside it (its size and modification time) answers the next process's same question.
A failed load is not noted: it is asked again. Torch versions without this probe (`VecISA._probe_load`) are left
as they are.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

NOTE_SUFFIX = ".loads"  # beside the probe library: "<size> <mtime_ns>" of the file a child process loaded


def remember_isa_probes() -> None:
    """Wrap inductor's probe load (once per process) so that a load that succeeded before is not made again."""
    try:
        from torch._inductor.cpu_vec_isa import VecISA
    except ImportError:
        return
    probe = getattr(VecISA, "_probe_load", None)
    if probe is None or getattr(probe, "remembered", False):
        return
    VecISA._probe_load = remembered(probe)  # type: ignore[method-assign,assignment]


def remembered(probe: Callable[[Any, str], bool]) -> Callable[[Any, str], bool]:
    """`probe(isa, library_path)`, skipped where a note says this very file loaded before."""

    @functools.wraps(probe)
    def probe_load(isa: Any, library_path: str) -> bool:
        note = Path(library_path + NOTE_SUFFIX)
        signature = _signature(library_path)
        if signature is not None and _read(note) == signature:
            return True
        loaded = probe(isa, library_path)
        if loaded and signature is not None:
            with contextlib.suppress(OSError):  # a read-only cache: the next process probes again
                note.write_text(signature)
        return loaded

    probe_load.remembered = True  # type: ignore[attr-defined]
    return probe_load


def _signature(path: str) -> str | None:
    try:
        stat = Path(path).stat()
    except OSError:
        return None
    return f"{stat.st_size} {stat.st_mtime_ns}"


def _read(note: Path) -> str | None:
    try:
        return note.read_text()
    except OSError:
        return None
