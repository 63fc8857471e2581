"""Multirun jobs: one status record per job, failures kept to their job, a summary at the end.

Every job of a sweep (whatever the launcher: basic, joblib, Ray) writes `status.json` in its own
directory: `running` when it starts, then `completed`, `pruned`, `failed` (with the one-line
error) or `interrupted`. The `SweepSummary` callback reads those records when the sweep ends,
prints one table, and makes `rl-train` exit non-zero when a job failed. The same records let
`resume=auto` finish a killed sweep: complete jobs are skipped, interrupted ones resume from
their last good checkpoint, the rest start.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from rlcli.registry import ConfigError

STATUS_FILE = "status.json"
DONE = ("completed", "pruned")
logger = logging.getLogger("rlcli")

# Set by SweepSummary.on_multirun_end in the process that ran the sweep; read by rl-train's main().
failed_jobs: list[dict[str, Any]] = []


def read_status(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / STATUS_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_status(run_dir: Path, record: dict[str, Any]) -> None:
    """Atomic, so a reader (the summary, rl-report, a resumed sweep) never sees half a record."""
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / f".{STATUS_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, run_dir / STATUS_FILE)


def _say(text: str) -> None:
    """One line on stderr; jobs of parallel launchers share the terminal, so no progress bars."""
    from rlcli.services.log import console

    console.print(text, highlight=False, markup=False, soft_wrap=True)


def run_job(cfg: DictConfig, run_dir: Path, job_num: int, overrides: list[str],
            test_hook_factory: Callable[[DictConfig], Any] | None = None,
            may_train: Callable[[Any], bool] | None = None) -> dict[str, Any]:
    """Run one job of a sweep and return its status record (never raises for a failed job). `may_train(signals)`,
    given the built trainer's StopSignals, says whether it still trains (parallel_jobs.py: not after the sweep's
    stop)."""
    from rlcli.run import lock as run_lock

    record, trainer = open_job(cfg, run_dir, job_num, overrides, test_hook_factory)
    if trainer is None:
        return record
    shown = shown_overrides(overrides)
    try:
        if may_train is not None and not may_train(trainer.signals):  # the sweep was stopped while it set up
            trainer.close()
            record.update(status="interrupted", error="stopped before training began", ended=time.time())
            write_status(run_dir, record)
            return record
        trainer.run()
    except BaseException as error:
        return end_record(record, run_dir, job_num, shown, error=error)
    else:
        return end_record(record, run_dir, job_num, shown, trainer=trainer)
    finally:
        run_lock.release(run_dir)


def open_job(cfg: DictConfig, run_dir: Path, job_num: int, overrides: list[str],
             test_hook_factory: Callable[[DictConfig], Any] | None = None) -> tuple[dict[str, Any], Any]:
    """A job's run dir locked, its `running` record written and its trainer built (or resumed): (record, trainer),
    the caller then releasing the lock. The trainer is None where the job ends here, its lock released: another
    process runs it, it is done already (resume=auto), or it failed to build; the record says which."""
    from rlcli.run import lock as run_lock

    job_started, shown = time.perf_counter(), shown_overrides(overrides)
    try:
        run_lock.acquire(run_dir)
    except ConfigError as error:  # another process runs this job: leave its directory alone
        _say(f"[job {job_num}] {shown}: {error}")
        return {"job": job_num, "overrides": list(overrides), "status": "failed", "error": str(error)}, None
    trainer = None
    try:
        record = start_record(cfg, run_dir, job_num, overrides, shown)
        if record["status"] not in DONE:  # else finished before: skipped
            try:
                trainer = job_trainer(cfg, run_dir, job_num, overrides, job_started, test_hook_factory)
            except BaseException as error:
                record = end_record(record, run_dir, job_num, shown, error=error)
    finally:
        if trainer is None:
            run_lock.release(run_dir)
    return record, trainer


def as_typed(override: str) -> str:
    """An override as a user types it: Hydra's sweeper hands a job `compile=True` for the `compile=true` typed, and
    rl-train gives Hydra `++algo.groups.x.lr=...` for `algo.groups.x.lr=...` (compose.schedule_args)."""
    from rlcli.run.compose import ADDED_KEYS

    if override.startswith("++") and override[2:].startswith(ADDED_KEYS):
        override = override[2:]
    key, sep, value = override.partition("=")
    return f"{key}={value.lower()}" if sep and value in ("True", "False") else override


def shown_overrides(overrides: list[str]) -> str:
    """A job's overrides as its lines show them (without the sweep's bookkeeping)."""
    return " ".join(as_typed(o) for o in overrides if not o.startswith(("sweep.trial", "resume=", "hydra.")))


def start_record(cfg: DictConfig, run_dir: Path, job_num: int, overrides: list[str], shown: str) -> dict[str, Any]:
    """The job's `running` record (written), or with resume=auto its earlier record when it is already done
    (then `cfg.resume` points at the last good checkpoint when there is one)."""
    from rlcli.services import checkpoint

    record: dict[str, Any] = {"job": job_num, "overrides": list(overrides), "status": "running",
                              "started": time.time()}
    if cfg.get("resume") == "auto":
        previous = read_status(run_dir)
        if previous is not None and previous.get("status") in DONE:
            steps, total = previous.get("env_steps"), cfg.train.total_steps
            longer = (f" (at {steps:,} env steps; a longer train.total_steps does not reopen a finished job: "
                      f"rl-train resume={run_dir} train.total_steps={total} trains it on)"
                      if previous.get("stop_reason") == "budget" and isinstance(steps, int)
                      and isinstance(total, int) and total > steps else "")  # (not a job stopped at its reward)
            _say(f"[job {job_num}] {shown}: already {previous['status']}, skipped{longer}")
            return previous
        found = checkpoint.find_good(run_dir / "checkpoints", warn=lambda m: _say(f"[job {job_num}] {m}"))
        cfg.resume = str(found) if found else None
        if found:
            _say(f"[job {job_num}] {shown}: resuming from {found.name}")
    write_status(run_dir, record)
    return record


def job_trainer(cfg: DictConfig, run_dir: Path, job_num: int, overrides: list[str], job_started: float,
                test_hook_factory: Callable[[DictConfig], Any] | None = None) -> Any:
    """A sweep job's trainer over its built (or resumed) components."""
    from hydra.core.hydra_config import HydraConfig

    from rlcli.run.state import prepare
    from rlcli.run.trainer import Trainer, TrainerOptions, header_labels

    components, state = prepare(cfg)
    pruner = test_hook_factory(cfg) if test_hook_factory is not None else None
    options = TrainerOptions(
        **header_labels(cfg, HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}),
        console="lines" if cfg.log.console else "off", console_prefix=f"[job {job_num}] ",
        sweep_group=sweep_dir_of(run_dir),  # tracked runs: one MLflow tag / W&B group per sweep
        job_started=job_started, typed_keys={o.split("=", 1)[0].lstrip("+~") for o in overrides},
        callbacks=[pruner] if pruner is not None else [],
    )
    return Trainer(components, run_dir, state, options)


def sweep_dir_of(run_dir: Path) -> str:
    """The sweep's directory (hydra.sweep.dir, as an absolute path), which `resume=auto` takes: a job's directory
    sits under it, one level down by default but deeper with a nested hydra.sweep.subdir."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return os.path.abspath(str(HydraConfig.get().sweep.dir))
    return str(run_dir.parent)


def end_record(record: dict[str, Any], run_dir: Path, job_num: int, shown: str, trainer: Any = None,
               error: BaseException | None = None) -> dict[str, Any]:
    """The job's final record from its trainer or what stopped it, written; a signal's SystemExit is re-raised
    after the record says `interrupted` (the sweep stops with it)."""
    from rlcli.run.stop import RunFailed

    if isinstance(error, ConfigError):
        record.update(status="failed", error=str(error))
    elif isinstance(error, RunFailed):  # the trainer's one-line failure (divergence, a failing env, a disk)
        cause = error.__context__  # the env's own exception, when an env failed
        detail = "".join(traceback.format_exception(cause)) if cause is not None else ""
        with contextlib.suppress(OSError):
            (run_dir / "error.txt").write_text(f"{error.message}\n{detail}")
        record.update(status="failed", error=error.message)
    elif isinstance(error, SystemExit):  # a signal: the trainer saved a checkpoint first
        record.update(status="interrupted", error=f"stopped with exit code {error.code}")
        write_status(run_dir, record)
        raise error
    elif isinstance(error, Exception):  # a crash in one job must not take the sweep down
        (run_dir / "error.txt").write_text("".join(traceback.format_exception(error)))
        record.update(status="failed", error=f"{type(error).__name__}: {error} (traceback in error.txt)")
    elif error is not None:
        raise error  # KeyboardInterrupt and the like
    else:
        _finished(record, trainer)
    record["ended"] = time.time()
    write_status(run_dir, record)
    if record["status"] == "failed":
        logger.error("job %d failed: %s", job_num, record["error"])
        _say(f"[job {job_num}] {shown}: FAILED: {record['error']}")
    return record


def _finished(record: dict[str, Any], trainer: Any) -> None:
    state = trainer.state
    record.update(status="pruned" if trainer.stop_reason == "pruned" else "completed",
                  stop_reason=str(trainer.stop_reason), env_steps=state.env_steps,
                  train_seconds=round(state.train_seconds, 3),
                  final_test_return=state.last_test_return, best_test_return=state.best_test_return)


def record_job_resumed_alone(run_dir: Path, trainer: Any) -> None:
    """A sweep's job resumed on its own (`rl-train resume=<job dir>`, as its stop line suggests) that trained to its
    end: its record says so, so that the sweep's resume=auto skips it (it resumed it, and heard the run had already
    finished) and rl-report counts it as the sweep's."""
    record = read_status(run_dir)
    if record is None or record.get("status") in DONE or "job" not in record:
        return
    _finished(record, trainer)
    record["ended"] = time.time()
    write_status(run_dir, record)


def job_records(sweep_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    found = []
    for path in sorted(sweep_dir.rglob(STATUS_FILE)):
        record = read_status(path.parent)
        if record is not None:
            found.append((path.parent, record))
    return sorted(found, key=lambda item: item[1].get("job", 0))


def _fmt(value: Any, spec: str = "{:.1f}") -> str:
    return "-" if value is None else spec.format(value)


class SweepSummary(Callback):
    """Hydra callback (conf/config.yaml: hydra.callbacks): one table for the whole sweep."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from rich.markup import escape
        from rich.table import Table

        from rlcli.services.log import console

        sweep_dir = Path(str(config.hydra.sweep.dir))
        records = job_records(sweep_dir)
        failed_jobs.clear()
        failed_jobs.extend(r for _, r in records if r.get("status") not in DONE)
        if not records:
            return
        lines = [[as_typed(o) for o in r.get("overrides", []) if not o.startswith(("sweep.trial", "resume="))]
                 for _, r in records]
        common = set.intersection(*(set(line) for line in lines))
        title = f"sweep {sweep_dir}" + (f"  (all jobs: {' '.join(sorted(common))})" if common else "")
        table = Table(title=escape(title), header_style="bold cyan")  # (overrides hold brackets: not markup)
        for column in ("job", "overrides", "status", "test return", "env steps", "seconds"):
            table.add_column(column, justify="left" if column in ("overrides", "status") else "right",
                             overflow="fold")
        for (_, r), line in zip(records, lines, strict=True):
            table.add_row(str(r.get("job")), escape(" ".join(o for o in line if o not in common)), r.get("status", "?"),
                          _fmt(r.get("final_test_return")), _fmt(r.get("env_steps"), "{:,}"),
                          _fmt(r.get("train_seconds")))
        console.print(table)
        for r in failed_jobs:
            error = escape(str(r.get("error", "no result")))
            console.print(f"[bold red]job {r.get('job')} {r.get('status')}[/]: {error}", highlight=False)
        if failed_jobs:
            console.print(f"{len(failed_jobs)} of {len(records)} jobs did not complete; finish them with the same "
                          f"command plus resume=auto hydra.sweep.dir={sweep_dir}", highlight=False)


# ------------------------------------------------------------------------------ checking before launch
def _expand(override: Any) -> list[str]:
    """The values a check tries for one override: itself, each value of a list or range sweep,
    both ends of an interval."""
    from rlcli.sweeps.tuning import parse_search_space

    if not override.is_sweep_override():
        return [override.input_line]
    key = override.get_key_element()
    try:  # a list, choice() or range(): the values as Hydra hands them to the jobs (null as null, not None)
        return [f"{key}={v}" for v in override.sweep_string_iterator()]
    except Exception:  # an interval() (Optuna's): its two ends
        dist = parse_search_space({key: override.input_line.split("=", 1)[1]})[key]
        return [f"{key}={'null' if v is None else v}" for v in dist.probe_values()]


def probe_combinations(args: list[str], limit: int = 16) -> list[list[str]]:
    """Command lines that try every swept value: the full product when small, else each value once."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(args)
    choices = [_expand(o) for o in parsed]
    total = 1
    for values in choices:
        total *= len(values)
    if total <= limit:
        return [list(combo) for combo in itertools.product(*choices)]
    firsts = [values[0] for values in choices]
    combos = [firsts]
    for i, values in enumerate(choices):
        for value in values[1:]:
            combos.append(firsts[:i] + [value] + firsts[i + 1:])
    return combos


def search_space_probes(params: dict[str, str]) -> list[str]:
    """`key=value` arguments at the edges of an Optuna search space (every choice, both interval ends)."""
    from rlcli.sweeps.tuning import parse_search_space

    probes = []
    for key, dist in parse_search_space(params).items():
        for value in dist.probe_values():
            probes.append(f"{key}={value}")
    return probes
