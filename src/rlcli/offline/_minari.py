"""Where Minari keeps datasets on this machine, and minari itself imported with a one-line error when missing.

Minari reads its root from MINARI_DATASETS_PATH at each call (else ~/.minari/datasets); `using_root` sets it for
the calls inside, so a caller's `root=` works without changing the process's environment for good.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlcli.registry import ConfigError

INSTALL = "pip install -e '.[offline]'"
# Minari's own id grammar: (namespace/)name-v<version>
ID_PATTERN = re.compile(r"(?:[\w.-]+/)*[\w.-]+-v\d+")


def require_minari() -> Any:
    """The minari module, or one line saying how to install it (it is an optional dependency)."""
    try:
        import minari
    except ImportError:
        raise ConfigError(f"Minari datasets need the minari package, which is not installed: {INSTALL}") from None
    try:
        import h5py  # noqa: F401  (Minari's default storage; without it minari fails deep inside a read)
    except ImportError:
        raise ConfigError(f"Minari's HDF5 storage needs h5py, which is not installed: {INSTALL}") from None
    return minari


def root(given: str | Path | None = None) -> Path:
    """The local Minari root: `given`, else MINARI_DATASETS_PATH, else ~/.minari/datasets (Minari's own rule)."""
    if given is not None:
        return Path(given).expanduser()
    found = os.environ.get("MINARI_DATASETS_PATH")
    return Path(found).expanduser() if found else Path.home() / ".minari" / "datasets"


def is_dataset_dir(path: Path) -> Path | None:
    """The `data` directory of a Minari dataset at `path` (the dataset's directory or its data/ itself), or None."""
    for data in (path / "data", path):
        if (data / "metadata.json").is_file():
            return data
    return None


@contextlib.contextmanager
def using_root(path: Path) -> Iterator[None]:
    """MINARI_DATASETS_PATH set to `path` for the calls inside, restored after."""
    before = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(path)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = before


def local_ids(path: Path) -> list[str]:
    """The dataset ids under a Minari root (directories holding data/metadata.json), without importing minari."""
    if not path.is_dir():
        return []
    return sorted(str(p.parent.parent.relative_to(path)) for p in path.rglob("data/metadata.json"))
