"""Where a run's numbers go: TensorBoard (x axis = env steps), a rich console, and train.log."""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from rlcli.services import jsonl
from rlcli.services.timing import PhaseClock

if TYPE_CHECKING:
    from rlcli.services.tracking import Tracking


def _silence(stream: Any) -> None:
    """Point a closed pipe's file descriptor at /dev/null: later writes, and the interpreter's flush at exit, then
    succeed instead of raising BrokenPipeError."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, stream.fileno())
    os.close(devnull)


class PipeSafeConsole(Console):
    """A console whose reader may go away (`rl-train ... | head`, `2>&1 | head`, a `tee` that was stopped) without
    ending the run, as rich's own handling would (exit 1): its stream goes to /dev/null from then on (stdout's said
    once on stderr, where that is still open); train.log still gets every line."""

    def on_broken_pipe(self) -> None:
        if self.quiet:
            return
        _silence(self.file)
        self.quiet = True
        if not self.stderr:
            say("rlcli: stdout was closed (the program reading it exited); the run goes on, its lines still go to "
                "train.log")


console = PipeSafeConsole(stderr=True)  # progress, messages, warnings
results = PipeSafeConsole()  # the run's results (its table lines and final summary): stdout, so `> out.txt` keeps them
logger = logging.getLogger("rlcli")


def say(line: str) -> None:
    """One line on stderr, written in one call: runs in a sweep's worker processes (joblib, the population
    launcher's) share its stderr, and `print` writes the text and its newline apart, so two workers' lines could
    run together on one line (a SIGTERM's "stopped at" lines did)."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except BrokenPipeError:  # stderr's reader went away (`2>&1 | head`): the run goes on, quietly
        _silence(sys.stderr)
        console.quiet = True


# Console table columns: (TensorBoard tag, header, format)
_TABLE = [
    ("rollout/return_mean", "return", "return"),  # fmt_return: three significant digits below 1 (LBF's 0.0385)
    ("rollout/ep_len_mean", "ep len", "{:.0f}"),
    ("eval/return_mean", "test return", "return"),
    ("time/sps", "SPS", "{:.0f}"),
    ("train/policy_loss", "pi loss", "{:.3g}"),
    ("train/value_loss", "v loss", "{:.3g}"),
    ("train/entropy", "entropy", "{:.3g}"),
    ("train/approx_kl", "kl", "{:.2g}"),
]


def fmt_return(value: float | None) -> str:
    """A return as people read it: one decimal, or three significant digits below 1 (success rates)."""
    if value is None:
        return "-"
    return f"{value:.1f}" if abs(value) >= 1 or value == 0 else f"{value:.3g}"  # 0.0 as the progress table says it


class RunLogger:
    """One object per run; the trainer calls `scalars`, `progress` and `close`."""

    def __init__(
        self, run_dir: Path, total_steps: int, console_mode: str, tensorboard: bool,
        start_step: int = 0, start_seconds: float = 0.0, prefix: str = "", tracking: Tracking | None = None,
    ) -> None:
        """`start_step` > 0 continues a run: anything logged after that step by the interrupted
        process is dropped (TensorBoard's purge_step, eval.jsonl rewritten), so no point appears twice.
        `console_mode`: full (progress bar and tables), lines (messages only: sweeps), off.
        `tracking`: MLflow / W&B sinks that receive every scalar TensorBoard receives."""
        self.run_dir = run_dir
        self.tracking = tracking
        self.show_console = console_mode != "off"
        # a table per log_every: a plain line on stdout (greppable, the same as train.log's), or a rich table
        # under the live bar when stdout and stderr are both a terminal; sweeps ("lines") print none
        self.table_lines = console_mode == "full"
        self.prefix = prefix
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # slow import: only when used

            self.writer = SummaryWriter(str(run_dir / "tb"), purge_step=start_step + 1)
        self._truncate_test_records(start_step)
        self.latest: dict[str, float] = {}
        self._dropped: set[str] = set()  # tags whose non-finite points were left out (said once each)
        self._progress: Progress | None = None
        if console_mode == "full" and console.is_terminal:
            self._progress = Progress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"),
                TextColumn("{task.fields[sps]:>6} SPS"), TimeRemainingColumn(),
                TextColumn("test {task.fields[test]}"), TextColumn("[dim]{task.fields[time]}"), console=console,
                transient=False,
            )
            self._task = self._progress.add_task("train", total=total_steps, completed=start_step, sps="-",
                                                 test="-", time="")
            self._progress.start()
        self._start = time.time() - start_seconds
        self._last_refresh = 0.0

    def rewind(self, step: int) -> None:
        """The run went back to `step` (a rollback): later TensorBoard points and test records are dropped, as
        when a run resumes, so that no step appears twice."""
        if self.writer is not None:
            from torch.utils.tensorboard import SummaryWriter

            log_dir = self.writer.log_dir
            self.writer.close()
            self.writer = SummaryWriter(log_dir, purge_step=step + 1)
        self._truncate_test_records(step)

    def _truncate_test_records(self, start_step: int) -> None:
        path = self.run_dir / "eval.jsonl"
        if path.is_file():
            records = jsonl.read_records(path, warn=self.message)
            jsonl.rewrite(path, [r for r in records if int(r.get("env_steps", 0)) <= start_step])

    def scalars(self, metrics: dict[str, float], step: int) -> None:
        for tag, value in metrics.items():
            if self.writer is not None and math.isfinite(value):
                self.writer.add_scalar(tag, value, step)
            elif self.writer is not None and tag not in self._dropped:  # TensorBoard cannot plot it: say so, once
                self._dropped.add(tag)
                self.message(f"warning: {tag} was {value} at {step:,} env steps; TensorBoard cannot plot it, so "
                             "that point is left out")
        if self.tracking is not None:
            self.tracking.scalars(metrics, step)
        self.latest.update(metrics)

    def test_result(self, step: int, returns: list[float], lengths: list[int],
                    extra: dict[str, object] | None = None) -> None:
        """Machine-readable record of every test phase (for rl-report and scripts); `extra`: more numbers of the
        phase (an offline run's normalized_score)."""
        record = {"env_steps": step, "wall_s": round(time.time() - self._start, 3),
                  "returns": returns, "lengths": lengths, **(extra or {})}
        jsonl.append_record(self.run_dir / "eval.jsonl", record)

    def table(self, step: int) -> None:
        """A compact one-row table of the latest numbers, also written as one line to train.log."""
        shown = []
        for tag, header, fmt in _TABLE:
            if tag in self.latest:
                value = self.latest[tag]
                shown.append((header, fmt_return(value) if fmt == "return" else fmt.format(value)))
            elif tag.startswith("train/"):  # algo.groups: each group's own (train/<group>/<metric>), in its place
                metric = tag.removeprefix("train/")
                shown += [(f"{key.split('/')[1]} {header}", fmt.format(value)) for key, value in self.latest.items()
                          if key.count("/") == 2 and key.startswith("train/") and key.endswith("/" + metric)]
        # env=pz: "return" is the team sum; each agent's own return after it (rollout/return_<agent>)
        shown[1:1] = [(tag.removeprefix("rollout/return_"), fmt_return(value)) for tag, value in self.latest.items()
                      if tag.startswith("rollout/return_") and tag != "rollout/return_mean"]
        line = f"step {step} | " + " | ".join(f"{h} {v}" for h, v in shown)
        logger.info("%s", line)
        if self._progress is None or not results.is_terminal:
            if self.table_lines:
                results.print(self.prefix + line, highlight=False, markup=False, soft_wrap=True)
            return
        table = Table(box=None, pad_edge=False, header_style="bold cyan")
        table.add_column("steps", justify="right")
        for header, _ in shown:
            table.add_column(header, justify="right")
        table.add_row(f"{step:,}", *[v for _, v in shown])
        self._progress.console.print(table)

    def progress(self, step: int, sps: float, test_return: float | None, clock: PhaseClock | None = None) -> None:
        """The live line: steps, SPS, last test return and the phases the time goes to."""
        if self._progress is not None:
            now = time.perf_counter()
            if now - self._last_refresh < 0.1 and step < self._progress.tasks[0].total:
                return  # the bar redraws at 10 Hz anyway; skip the bookkeeping in between
            self._last_refresh = now
            test = fmt_return(test_return)
            self._progress.update(self._task, completed=step, sps=f"{sps:.0f}", test=test,
                                  time=clock.summary() if clock is not None else "")

    def result(self, text: str) -> None:
        """A line of the run's results (the final summary): stdout, or the live display when both are a terminal."""
        logger.info(text)
        if not self.show_console:
            return
        if self._progress is not None and results.is_terminal:
            console.print(self.prefix + text, highlight=False, markup=False, soft_wrap=True)
        else:
            results.print(self.prefix + text, highlight=False, markup=False, soft_wrap=True)

    def message(self, text: str) -> None:
        logger.info(text)
        if self.show_console:
            console.print(self.prefix + text, highlight=False, markup=False, soft_wrap=True)

    def close(self, status: str = "FINISHED", summary: dict[str, float] | None = None,
              files: list[Path] | None = None) -> None:
        """End the run's logs; tracked runs end with `status` (FINISHED, KILLED, FAILED), the summary and the files.
        A second call does nothing."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.tracking is not None:
            tracking, self.tracking = self.tracking, None
            tracking.finish(status, summary, files or [])
