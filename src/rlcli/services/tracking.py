"""Experiment tracking next to TensorBoard: MLflow and Weights & Biases, through their own clients.

Each sink gets what TensorBoard gets (every scalar at its env step), plus the resolved config, tags,
the final test return and the run's files (its `.hydra/` config, final and best checkpoints, videos).
The sinks see the scalars in batches (every few seconds and at each checkpoint), not one call per
point, so a tracked run costs a few calls a minute.

Resume continues the same tracked run: its id is in the checkpoint, and `tracking.json` in the run
dir records the last env step each sink received. A resumed run recomputes the steps after its
checkpoint exactly, so the points the stopped process had already sent are skipped, not sent twice.

A sink that cannot start is one line before training (exit code 2); one that fails mid-run is a warning
and the run goes on with the others and TensorBoard.
"""

from __future__ import annotations

import json
import logging
import math
import netrc
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlcli.registry import ConfigError, require
from rlcli.services.log import say
from rlcli.services.tracking_sinks import SINKS, WANDB_MODES, RunInfo, Sink, TrackingSettings

STATE_FILE = "tracking.json"
FLUSH_SECONDS = 5.0


def settings_of(cfg: DictConfig) -> TrackingSettings:
    """The log.* tracking keys, checked (types and choices) without importing any tracking library."""
    log = cfg.get("log") or {}
    values = {key: log.get(key, default) for key, default in TrackingSettings().__dict__.items()}
    for key in ("mlflow", "wandb"):
        require(isinstance(values[key], bool), f"log.{key}", values[key], "expected true or false")
    for key in ("mlflow_uri", "mlflow_experiment", "wandb_project", "wandb_entity"):
        require(values[key] is None or isinstance(values[key], str), f"log.{key}", values[key],
                "expected a string or null")
    require(values["wandb_mode"] in WANDB_MODES, "log.wandb_mode", values["wandb_mode"],
            f"choose from: {', '.join(WANDB_MODES)}")
    return TrackingSettings(**values)


def default_mlflow_uri(run_dir: Path) -> str:
    """rlcli's MLflow store where neither log.mlflow_uri nor MLFLOW_TRACKING_URI names one: `mlflow.db` in the runs
    folder that holds the run (the nearest parent of its directory named `runs`, as in runs/<algo>/<env>/<time>),
    else in `./runs` of the working directory (a sweep's jobs under multirun/, a hydra.run.dir elsewhere). Its
    artifacts go to `mlartifacts/<experiment>/` beside it (tracking_sinks.artifacts_beside): nothing lands in the
    working directory itself, and a resume from another directory finds the same store."""
    run_dir = run_dir.expanduser().absolute()
    folder = next((p for p in run_dir.parents if p.name == "runs"), Path.cwd().absolute() / "runs")
    folder.mkdir(parents=True, exist_ok=True)  # sqlite makes the file, not its folder
    return f"sqlite:///{folder / 'mlflow.db'}"


def with_default_store(settings: TrackingSettings, run_dir: Path) -> TrackingSettings:
    if not settings.mlflow or settings.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI"):
        return settings
    import dataclasses

    return dataclasses.replace(settings, mlflow_uri=default_mlflow_uri(run_dir))


def check_tracking(cfg: DictConfig) -> None:
    """Start-up check, before any run dir exists: the libraries are installed and the servers reachable."""
    settings = settings_of(cfg)
    if settings.mlflow:
        _import("mlflow", "log.mlflow=true", "mlflow")
        uri = settings.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI", "")
        if uri.startswith("file:") or (uri and "://" not in uri and not uri.startswith("databricks")):
            raise ConfigError(f"log.mlflow_uri={uri!r}: MLflow 3 no longer takes a file store; use a database, e.g. "
                              "log.mlflow_uri=sqlite:///mlflow.db (its artifacts go to mlartifacts/ beside it), or a "
                              "server's http:// address")
        if uri.startswith(("http://", "https://")):
            _require_reachable(uri.rstrip("/") + "/health", f"log.mlflow_uri={uri!r}")
    if settings.wandb:
        _import("wandb", "log.wandb=true", "wandb")
        if settings.wandb_mode == "online" and not _wandb_key_present():
            raise ConfigError("log.wandb_mode=online needs a W&B API key (run `wandb login` or set WANDB_API_KEY); "
                              "log.wandb_mode=offline logs to the run dir with no network (upload later with "
                              "`wandb sync`)")


def _import(module: str, what: str, extra: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ConfigError(f"{what} needs {module}, which is not installed ({error}): "
                          f"pip install -e '.[{extra}]'") from None


def _require_reachable(url: str, what: str) -> None:
    try:
        with urllib.request.urlopen(url, timeout=5):  # noqa: S310 (the user's own tracking server)
            pass
    except urllib.error.HTTPError:
        return  # the server answered (an older server may lack /health): reachable
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise ConfigError(f"{what}: the MLflow server does not answer ({reason}); start it, fix the address, "
                          "or leave log.mlflow_uri unset for MLflow's local store") from None


def _wandb_key_present() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0]
    try:
        return netrc.netrc().authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


_NAMES = {"mlflow": "MLflow", "wandb": "W&B"}


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


# ------------------------------------------------------------------------------------------- tracking
class Tracking:
    """Fans the run's scalars out to the enabled sinks, in batches, each sink from where it left off."""

    def __init__(self, sinks: dict[str, Sink], run_dir: Path, sent_through: dict[str, int],
                 warn: Callable[[str], None]) -> None:
        self.sinks, self.run_dir, self.sent_through, self.warn = sinks, run_dir, sent_through, warn
        self._pending: list[tuple[str, float, int]] = []
        self._last_flush = time.monotonic()
        self._state_warned = False

    @classmethod
    def start(cls, cfg: DictConfig, run_dir: Path, start_step: int, run_ids: Mapping[str, str],
              group: str | None, warn: Callable[[str], None]) -> Tracking:
        """Start (or, with the checkpoint's `run_ids`, continue) one tracked run per enabled sink. A sink that
        cannot start raises a one-line ConfigError."""
        settings = with_default_store(settings_of(cfg), run_dir)
        info = run_info(cfg, run_dir, group)
        saved = _read_state(run_dir)
        sinks: dict[str, Sink] = {}
        sent_through: dict[str, int] = {}
        wanted = settings.chosen
        for key in wanted:
            run_id = run_ids.get(key)
            try:
                sinks[key] = SINKS[key](settings, info, run_id)
            except ConfigError:
                raise
            except Exception as error:  # each library raises its own types
                for started in sinks.values():
                    started.finish("FAILED")
                problem = _first_line(error)
                raise ConfigError(f"log.{key}=true: {_NAMES[key]} could not start a run ({problem})") from None
            previous = saved.get(key, {})
            same_run = run_id is not None and previous.get("run_id") == run_id
            sent_through[key] = max(start_step, int(previous.get("sent_through", 0)) if same_run else 0)
        tracking = cls(sinks, run_dir, sent_through, warn)
        tracking._write_state()
        return tracking

    @property
    def run_ids(self) -> dict[str, str]:
        return {key: sink.run_id for key, sink in self.sinks.items()}

    def describe(self) -> list[str]:
        return [sink.where for sink in self.sinks.values()]

    def scalars(self, metrics: Mapping[str, float], step: int) -> None:
        self._pending.extend((tag, float(value), step) for tag, value in metrics.items() if math.isfinite(value))
        if time.monotonic() - self._last_flush >= FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        """Send what is pending to each sink (only the steps it has not received yet) and note how far each got."""
        self._last_flush = time.monotonic()
        pending, self._pending = self._pending, []
        if not pending or not self.sinks:
            return
        for key in list(self.sinks):
            points = [p for p in pending if p[2] > self.sent_through[key]]
            if points and self._call(key, "log", points):
                self.sent_through[key] = max(p[2] for p in points)
        self._write_state()

    def finish(self, status: str, summary: Mapping[str, float] | None = None, files: Iterable[Path] = ()) -> None:
        """Flush, record the summary and the files, and close every sink's run (MLflow's FINISHED / KILLED /
        FAILED; W&B's exit code)."""
        self.flush()
        paths = [p for p in files if p.is_file()]
        for key in list(self.sinks):
            if summary:
                self._call(key, "summary", dict(summary))
            if paths:
                self._call(key, "files", self.run_dir, paths)
            self._call(key, "finish", status)
        self.sinks = {}

    def _call(self, key: str, method: str, *args: Any) -> bool:
        sink = self.sinks.get(key)
        if sink is None:
            return False
        try:
            getattr(sink, method)(*args)
            return True
        except Exception as error:  # a tracking failure must never stop training
            del self.sinks[key]
            self.warn(f"{sink.name} logging failed ({type(error).__name__}: {_first_line(error)}); training goes on "
                      "with TensorBoard and the other sinks")
            return False

    def _write_state(self) -> None:
        state = _read_state(self.run_dir)
        for key, sink in self.sinks.items():
            state[key] = {"run_id": sink.run_id, "sent_through": self.sent_through[key]}
        path = self.run_dir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(state, indent=1))
            tmp.replace(path)
        except OSError as error:  # a full or read-only disk must not stop training; a resume may then resend
            if not self._state_warned:
                self._state_warned = True
                self.warn(f"cannot write {path} ({error.strerror}); a resume may send some points twice")


def _read_state(run_dir: Path) -> dict[str, Any]:
    path = run_dir / STATE_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def run_info(cfg: DictConfig, run_dir: Path, group: str | None) -> RunInfo:
    config: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    config.pop("resume", None)  # differs between the first process and a resumed one; not a setting
    settings = settings_of(cfg)
    algo, env, seed = str(cfg.algo.name), str(cfg.env.id), str(cfg.seed)
    env_name = env.replace("/", "-").replace(":", "-")
    return RunInfo(config=config, name=f"{algo}-{env_name}-seed{seed}",
                   experiment=settings.mlflow_experiment or f"{algo}-{env_name}",
                   tags={"algo": algo, "env": env, "seed": seed, "rlcli.run_dir": str(run_dir)},
                   group=group, run_dir=run_dir)


MAX_CHECKPOINT_BYTES = 200 * 2**20


def run_files(run_dir: Path, final_checkpoint: Path | None, say: Callable[[str], None]) -> list[Path]:
    """What a tracked run keeps: the composed config, the best and final checkpoints, the videos. A final
    checkpoint over 200 MiB (a large replay buffer) stays in the run dir only, and `say` tells the user."""
    files = sorted((run_dir / ".hydra").glob("*.yaml"))
    files.append(run_dir / "checkpoints" / "best.pt")
    if final_checkpoint is not None:
        size = final_checkpoint.stat().st_size
        if size <= MAX_CHECKPOINT_BYTES:
            files.append(final_checkpoint)
        else:
            say(f"tracking: the final checkpoint ({size / 2**20:.0f} MiB, with the replay buffer) stays in "
                f"{final_checkpoint.parent} only; best.pt (the networks) is tracked")
    files += sorted(p for p in (run_dir / "videos").glob("*") if p.is_file())
    return files


def start_for_run(cfg: DictConfig, run_dir: Path, env_steps: int, run_ids: Mapping[str, str], group: str | None,
                  in_python: bool, on_error: Callable[[], None]) -> Tracking | None:
    """The tracked runs of a training run (None: tracking is off). A sink that cannot start calls `on_error` (the
    trainer closes its envs), then is one line and exit code 2 from rl-train, or the ConfigError itself for a
    sweep's job (its status says why and the sweep goes on) and for Python: nothing has been trained yet."""
    if not settings_of(cfg).enabled:
        return None

    def warn(text: str) -> None:
        say(f"rl-train: warning: {text}")
        logging.getLogger("rlcli").info("warning: %s", text)

    try:
        return Tracking.start(cfg, run_dir, env_steps, run_ids, group, warn)
    except ConfigError as error:
        on_error()
        if group is not None or in_python:
            raise
        say(f"rl-train: error: {error}")
        raise SystemExit(2) from None
