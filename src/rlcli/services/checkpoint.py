"""Checkpoint files that verify themselves, are written atomically, and point to the latest good one.

File layout: an 8-byte magic, a 4-byte format version, the SHA-256 of the payload, then the payload
(a torch.save archive of tensors and plain values only, see plain_state.py, read back with
`weights_only=True`: reading a checkpoint never runs code from it). The checksum catches torn and
corrupted files; it is not a signature, and need not be: a crafted file can hold only data.
Format 1 (before rlcli 0.x's safe format) was a full pickle: it is refused, except that its network
weights may be read for rl-eval or a warm start when the user says the file is trusted
(`trusted_checkpoint=true`). A file is written to a temporary name, flushed, fsynced and renamed into
place; `checkpoints/latest` names it only after that. A truncated or corrupted file fails the
checksum and is reported in one line; resume then falls back to the previous good file.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import random
import struct
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlcli.registry import ConfigError
from rlcli.services import plain_state

MAGIC = b"RLCLICKP"
FORMAT_VERSION = 2
PICKLE_FORMAT = 1  # a full pickle: read only with trusted=True
_HEADER = struct.Struct("<8sI32s")
LATEST = "latest"
ZIP_MAGIC = b"PK\x03\x04"  # the start of a torch.save archive (a zip file)


class CheckpointError(ConfigError):
    """A checkpoint that cannot be used; the message is one line naming the file and why."""


def rng_state(numpy: bool = True) -> dict[str, Any]:
    """(`numpy=False`: without numpy's, which a population's member keeps in its own generator.)"""
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if numpy:
        state["numpy"] = np.random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """`.cpu()`: a checkpoint loaded with map_location=cuda (a GPU run's resume) carries its generator states on the
    GPU, and torch takes them only as CPU byte tensors."""
    random.setstate(state["python"])
    if "numpy" in state:
        np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as error:  # a full disk, a size limit: no half-written file stays behind, under any name
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise OSError(error.errno, error.strerror, str(path)) from None
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def write(path: Path, env_steps: int, payload: dict[str, Any]) -> Path:
    """One verified checkpoint file, written atomically (`best.pt`, or a `ckpt_*.pt` through `save`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save(plain_state.encode({"env_steps": env_steps, **payload}, objects=True), buffer)
    body = buffer.getvalue()
    _write_atomic(path, _HEADER.pack(MAGIC, FORMAT_VERSION, hashlib.sha256(body).digest()) + body)
    return path


def save(directory: Path, env_steps: int, payload: dict[str, Any], keep: int) -> Path:
    """Write `ckpt_<env steps>.pt`, then point `latest` at it, then drop all but the newest `keep`."""
    path = write(directory / f"ckpt_{env_steps:012d}.pt", env_steps, payload)
    _write_atomic(directory / LATEST, (path.name + "\n").encode())
    for old in sorted(directory.glob("ckpt_*.pt"))[:-keep]:
        old.unlink()
    return path


def load(path: Path | str, map_location: str | torch.device = "cpu", trusted: bool = False) -> dict[str, Any]:
    """Read and verify a checkpoint; raise CheckpointError (one line) if it cannot be used. Only tensors and
    plain values are read; `trusted` also reads a format-1 file, which is a pickle that can run code."""
    body = verify(path, trusted=trusted)
    if _verified.get("version") == PICKLE_FORMAT:
        old: dict[str, Any] = torch.load(io.BytesIO(body), map_location=map_location, weights_only=False)
        old["format"] = PICKLE_FORMAT
        return old
    if bytes(body[:4]) != ZIP_MAGIC:  # torch.save's archive is a zip; anything else was not written by rlcli
        kind = f"a raw pickle (protocol {body[1]})" if bytes(body[:1]) == b"\x80" and len(body) > 1 else \
            "something else"
        raise CheckpointError(f"{path} holds {kind}, not the torch.save archive of tensors and plain values that "
                              "rlcli writes, so it was not read")
    try:
        with warnings.catch_warnings():  # torch's own advice about what it read is noise here: the line below says it
            warnings.simplefilter("ignore")
            data = plain_state.decode(torch.load(io.BytesIO(body), map_location=map_location, weights_only=True))
    except Exception as error:  # torch's refusal of a class or function, or a record we do not know
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        first = next((line.split("error:", 1)[1].strip() for line in lines if "WeightsUnpickler error:" in line),
                     lines[0] if lines else "").split(". Please use")[0] or type(error).__name__
        raise CheckpointError(f"{path} holds something other than tensors and plain values, so it was not read "
                              f"({first[:160]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("env_steps"), int):
        raise CheckpointError(f"{path} is not an rlcli checkpoint (no env_steps in it)")
    data["format"] = FORMAT_VERSION
    return data


def require(data: dict[str, Any], path: Path | str, *keys: str) -> None:
    """One line naming the first of `keys` that a checkpoint lacks (a checksum-valid file may still be partial)."""
    for key in keys:
        node: Any = data
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                raise CheckpointError(f"{path} has no {key!r}: it is not a complete rlcli checkpoint")
            node = node[part]


# The last file verified, with its size and mtime: resuming checks the file, then loads it; it is read
# and hashed once, not once per step.
_verified: dict[str, Any] = {}


def _read_file(path: Path) -> bytes:
    return path.read_bytes()


def verify(path: Path | str, trusted: bool = False) -> memoryview:
    """Check magic, format version and checksum; return the payload."""
    path = Path(path)
    try:
        stat = path.stat()
        key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
        if _verified.get("key") == key and (trusted or _verified["version"] != PICKLE_FORMAT):
            cached: memoryview = _verified["body"]
            return cached
        raw = _read_file(path)
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e.strerror}") from None
    if len(raw) < _HEADER.size or raw[:8] != MAGIC:
        raise CheckpointError(f"{path} is not an rlcli checkpoint (or is truncated)")
    _, version, digest = _HEADER.unpack_from(raw)
    if version == PICKLE_FORMAT and not trusted:
        raise CheckpointError(
            f"{path} has checkpoint format {PICKLE_FORMAT} (a pickle, which can run code when read); this rlcli "
            f"resumes format {FORMAT_VERSION} only. If you trust the file, trusted_checkpoint=true reads its "
            "network weights (rl-eval, actor.init_from, the kl_prior add-on)")
    if version not in (FORMAT_VERSION, PICKLE_FORMAT):
        raise CheckpointError(
            f"{path} has checkpoint format version {version}; this rlcli reads version {FORMAT_VERSION}"
        )
    body = memoryview(raw)[_HEADER.size:]
    if hashlib.sha256(body).digest() != digest:
        raise CheckpointError(f"{path} is corrupted or truncated (checksum mismatch)")
    _verified.clear()
    _verified.update(key=key, body=body, version=version)
    return body


def candidates(directory: Path) -> list[Path]:
    """Checkpoints newest first, the one `latest` names leading."""
    files = sorted(directory.glob("ckpt_*.pt"), reverse=True)
    pointer = directory / LATEST
    if pointer.is_file():
        named = directory / pointer.read_text().strip()
        if named in files:
            files.remove(named)
            files.insert(0, named)
    return files


def find_good(directory: Path, warn: Any = print) -> Path | None:
    """The newest checkpoint that verifies; each bad one is reported through `warn` in one line."""
    for path in candidates(directory):
        try:
            verify(path)
        except CheckpointError as error:
            warn(f"{error}; trying an older checkpoint")
            continue
        return path
    return None


def resolve(path: Path | str) -> Path:
    """A checkpoint file from what a user may name: the file, a `checkpoints/latest` pointer, a run's
    `checkpoints/` directory or the run directory (the newest good checkpoint there)."""
    path = Path(path).expanduser()
    if path.name == LATEST and path.is_file():
        return path.parent / path.read_text().strip()
    if path.is_dir():
        directory = path / "checkpoints" if (path / "checkpoints").is_dir() else path
        found = find_good(directory, warn=lambda message: None)
        if found is None:
            raise CheckpointError(f"no usable checkpoint in {directory}")
        return found
    return path


def checkpoint_steps(path: Path) -> int:
    return int(path.stem.split("_")[-1]) if path.stem.startswith("ckpt_") else 0
