"""A population's member: one sweep job's trainer, with its own RNG streams and its own train.log."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlcli.run import lock as run_lock
from rlcli.run.builtin_callbacks import Iteration
from rlcli.run.trainer import PlannedUpdate, Trainer
from rlcli.services import checkpoint
from rlcli.sweeps.jobs import end_record
from rlcli.sweeps.population.numpy_stream import NumpyStream


@dataclass
class Member:
    """One job of the sweep, trained in step with the others. `turn()` makes the process look as this job's
    single run would: its RNG streams in torch, numpy and random, its train.log as the log file."""

    trainer: Trainer
    run_dir: Path
    job_num: int
    shown: str  # the job's overrides, for the console
    record: dict[str, Any]  # its status.json record (sweeps/jobs.py)
    rng: dict[str, Any] = field(default_factory=checkpoint.rng_state)  # taken right after it was built or resumed
    it: Iteration | None = None
    planned: PlannedUpdate | None = None
    metrics: dict[str, Any] | None = None  # its share of the batched update
    live: bool = True  # still training: its rows of the population are stepped
    warming_up: bool = False  # an off-policy member before algo.learning_starts: random actions, no update
    _log_file: logging.FileHandler | None = None
    _numpy: NumpyStream | None = None  # its numpy stream, from its first turn on (rng's "numpy" until then)

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        root = logging.getLogger()
        if self._log_file is None:
            self._log_file = _file_handler_like(root, self.run_dir / "train.log")
        others = [h for h in root.handlers if isinstance(h, logging.FileHandler)]
        for handler in others:
            root.removeHandler(handler)
        root.addHandler(self._log_file)
        if self._numpy is None:
            self._numpy = NumpyStream(self.rng.pop("numpy"))
        self._numpy.enter()
        checkpoint.set_rng_state(self.rng)  # python's and torch's (and CUDA's)
        try:
            yield
        finally:
            self.rng = checkpoint.rng_state(numpy=False)
            self._numpy.leave()
            root.removeHandler(self._log_file)
            for handler in others:
                root.addHandler(handler)

    def end(self, error: BaseException | None = None) -> None:
        """Write the job's final record (completed, failed or interrupted), free its run dir, leave the batch."""
        self.live = False
        try:
            self.record = end_record(self.record, self.run_dir, self.job_num, self.shown,
                                     trainer=self.trainer if error is None else None, error=error)
        except SystemExit:
            pass  # interrupted: the record says so; the launcher stops the sweep once every member is saved
        finally:
            if self._log_file is not None:
                self._log_file.close()
            run_lock.release(self.run_dir)


def _file_handler_like(root: logging.Logger, path: Path) -> logging.FileHandler:
    """A handler appending to `path` with the formatter and level of Hydra's job log file handler."""
    handler = logging.FileHandler(path, mode="a")
    for existing in root.handlers:
        if isinstance(existing, logging.FileHandler):
            handler.setFormatter(existing.formatter)
            handler.setLevel(existing.level)
            break
    return handler
