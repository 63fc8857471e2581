"""Filesystem faults (a full or read-only disk, a size limit, a vanished directory) as one line, the same in
rl-train, rl-eval and rl-report. Imports nothing heavy: rl-report uses it without torch."""

from __future__ import annotations

import logging
import threading

HINTS = {28: " (the disk is full)", 27: " (a file-size limit, ulimit -f)", 30: " (a read-only file system)",
         13: " (no permission)", 2: " (the directory was moved or deleted?)"}


def describe_os_error(error: OSError, fallback_path: object = None) -> str:
    """`cannot write <path>: <cause> (<hint>)`."""
    name = error.filename.decode(errors="replace") if isinstance(error.filename, bytes) else error.filename
    name = name or fallback_path
    path = f" {name}" if name else ""
    return f"cannot write{path}: {error.strerror or error}{HINTS.get(error.errno or 0, '')}"


def quiet_thread_os_errors(args: threading.ExceptHookArgs) -> None:
    """TensorBoard's writer thread meets the same disk fault as the loop, which reports it in one line: the thread's
    traceback goes to train.log only."""
    if isinstance(args.exc_value, OSError):
        logging.getLogger("rlcli").info("a background writer stopped: %s", args.exc_value)
        return
    threading.__excepthook__(args)
