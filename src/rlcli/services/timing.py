"""Where a run's wall time goes: seconds per phase of the loop, kept by the trainer and collector.

Phases: env (vector-env stepping), act (the policy's forward pass and sampling), buffer (storing
steps, computing advantages), update (the algorithm's gradient steps, including minibatch
sampling), test, checkpoint, log; `other` is the rest of the loop. The clock costs two
`perf_counter` calls per timed block (about 0.1 us), well under 1% of a vector-env step.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

PHASES = ("env", "act", "buffer", "update", "test", "checkpoint", "log")
SHORT = {"env": "env", "act": "act", "buffer": "buf", "update": "upd", "test": "test", "checkpoint": "ckpt",
         "log": "log", "other": "other", "others": "members"}
# `others` (a population member's wait while the other members take their turns) shows as `members`, so that the
# time line does not set `others 84%` beside `other 4%` (the loop's own rest); TensorBoard keeps time/others_*


class PhaseClock:
    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._start = time.perf_counter()

    def restart(self) -> None:
        """Count from now (a resumed run reports the time of this process)."""
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._start = time.perf_counter()

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start

    def totals(self) -> dict[str, float]:
        """Seconds per phase, plus `other` (loop overhead) and `total` (wall time since the start)."""
        total = time.perf_counter() - self._start
        out = dict(self.seconds)
        out["other"] = max(0.0, total - sum(self.seconds.values()))
        out["total"] = total
        return out

    def scalars(self) -> dict[str, float]:
        """TensorBoard tags `time/<phase>_s` (cumulative seconds) and `time/<phase>_frac`."""
        totals = self.totals()
        total = max(totals.pop("total"), 1e-9)
        out = {}
        for phase, seconds in totals.items():
            out[f"time/{phase}_s"] = seconds
            out[f"time/{phase}_frac"] = seconds / total
        return out

    def summary(self, top: int = 4) -> str:
        """`upd 61% env 22% act 11% buf 4%`: the phases that bound this run, largest first."""
        totals = self.totals()
        total = max(totals.pop("total"), 1e-9)
        ranked = sorted(totals.items(), key=lambda kv: -kv[1])[:top]
        return " ".join(f"{SHORT[p]} {100 * s / total:.0f}%" for p, s in ranked)
