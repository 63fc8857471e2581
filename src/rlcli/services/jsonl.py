"""Append-only JSON-lines files (`eval.jsonl`) that survive a torn write.

A write cut short (a kill, a full disk, a file-size limit) leaves a last line without its newline or
half a record. Readers drop such lines and say so once; writers first cut a torn tail back to the
last whole record, then add each record with one `write` on an O_APPEND descriptor, so a record is
either whole or absent for the next reader.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def read_records(path: Path, warn: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Every whole record in `path` (none if it is missing); torn or damaged lines are skipped, with one warning."""
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return []
    records, dropped = [], 0
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict) or (i == len(lines) - 1 and not text.endswith("\n")):
            dropped += 1  # the last line without its newline is torn even when it happens to parse
            continue
        records.append(record)
    if dropped and warn is not None:
        warn(f"{path}: skipped {dropped} torn or damaged line{'s' if dropped > 1 else ''} "
             "(a write that was cut short)")
    return records


def _cut_torn_tail(path: Path) -> None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    if data and not data.endswith(b"\n"):
        with open(path, "r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)


def append_record(path: Path, record: dict[str, Any]) -> None:
    """Add one record as one whole line."""
    _cut_torn_tail(path)
    line = (json.dumps(record) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        written = os.write(fd, line)
        if written != len(line):  # a short write (a size limit): take the partial record back out
            os.ftruncate(fd, os.fstat(fd).st_size - written)
            raise OSError(27, "File too large: the record was not written whole", str(path))
    finally:
        os.close(fd)


def rewrite(path: Path, records: list[dict[str, Any]]) -> None:
    """Replace the file's records at once (a temporary file, then a rename)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    os.replace(tmp, path)
