"""The tracking sinks: MLflow's and W&B's own clients behind one small interface (tracking.py fans a run's
scalars out to them). Each library is imported only when its sink starts."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

WANDB_MODES = ("online", "offline")


@dataclass(frozen=True)
class TrackingSettings:
    mlflow: bool = False
    mlflow_uri: str | None = None  # None: MLFLOW_TRACKING_URI, else runs/mlflow.db (tracking.default_mlflow_uri)
    mlflow_experiment: str | None = None  # None: <algo>-<env>
    wandb: bool = False
    wandb_project: str | None = None  # None: rlcli
    wandb_entity: str | None = None
    wandb_mode: str = "online"

    @property
    def enabled(self) -> bool:
        return self.mlflow or self.wandb

    @property
    def chosen(self) -> list[str]:
        """The sinks' keys in SINKS that log.* turns on."""
        return [key for key, on in (("mlflow", self.mlflow), ("wandb", self.wandb)) if on]


def flat_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """`{"algo": {"lr": 3e-4}}` -> `{"algo.lr": "0.0003"}`: the config as MLflow parameters."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flat_params(value, f"{name}."))
        else:
            flat[name] = "null" if value is None else str(value)
    return flat


def artifacts_beside(tracking_uri: str, experiment: str) -> str | None:
    """A sqlite store's artifacts in `mlartifacts/<experiment>` beside its database file (MLflow's own default is
    ./mlruns of whatever directory the run was started from); None (the server decides) for other stores."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    database = Path(tracking_uri[len("sqlite:///"):]).expanduser().resolve()
    return (database.parent / "mlartifacts" / experiment).as_uri()


class Sink(Protocol):
    name: str
    run_id: str
    where: str  # the console's tracking: line: which run, where

    def log(self, points: list[tuple[str, float, int]]) -> None: ...
    def summary(self, values: Mapping[str, float]) -> None: ...
    def files(self, run_dir: Path, paths: list[Path]) -> None: ...
    def finish(self, status: str) -> None: ...


@dataclass
class RunInfo:
    """What every sink names the run by."""

    config: dict[str, Any]
    name: str
    experiment: str
    tags: dict[str, str]
    group: str | None
    run_dir: Path


class MlflowSink:
    name = "MLflow"

    def __init__(self, settings: TrackingSettings, info: RunInfo, run_id: str | None) -> None:
        import logging

        from mlflow.entities import Param, RunTag
        from mlflow.tracking import MlflowClient

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # its INFO lines ("Creating initial MLflow database
        # tables...") would land between rlcli's console lines; the tracking: line says where the run is
        self.client = MlflowClient(settings.mlflow_uri)
        experiment = self.client.get_experiment_by_name(info.experiment)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else self.client.create_experiment(info.experiment,
                                                            artifact_location=artifacts_beside(self.client.tracking_uri,
                                                                                               info.experiment)))
        tags = dict(info.tags, **({"rlcli.sweep": info.group} if info.group else {}))
        if run_id is not None:
            self.run_id = run_id
            self.client.update_run(run_id, status="RUNNING")
        else:
            run = self.client.create_run(experiment_id, run_name=info.name, tags=tags)
            self.run_id = run.info.run_id
            params = [Param(k, v[:6000]) for k, v in flat_params(info.config).items()]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters per call
                self.client.log_batch(self.run_id, params=params[i:i + 100], tags=[RunTag(k, v) for k, v in
                                                                                   (tags.items() if i == 0 else [])])
        self.uri = self.client.tracking_uri
        self.where = f"MLflow run {self.run_id} in experiment {info.experiment!r} at {self.uri}"

    def log(self, points: list[tuple[str, float, int]]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, value, step in points]
        for i in range(0, len(metrics), 1000):  # MLflow takes at most 1000 metrics per call
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def summary(self, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        step = int(values.get("final/env_steps", 0))
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()])

    def files(self, run_dir: Path, paths: list[Path]) -> None:
        for path in paths:
            folder = path.parent.relative_to(run_dir).as_posix()
            self.client.log_artifact(self.run_id, str(path), None if folder == "." else folder.lstrip("."))

    def finish(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status=status)


class WandbSink:
    name = "W&B"

    def __init__(self, settings: TrackingSettings, info: RunInfo, run_id: str | None) -> None:
        import wandb

        self.run = wandb.init(
            project=settings.wandb_project or "rlcli", entity=settings.wandb_entity, mode=settings.wandb_mode,
            dir=str(info.run_dir), id=run_id, resume="allow" if run_id else None, name=info.name,
            group=info.group, tags=[f"{k}={v}" for k, v in info.tags.items() if k in ("algo", "env", "seed")],
            config=info.config, reinit="create_new",
            # rlcli draws its own console; W&B must not wrap stdout/stderr or print over the progress bar
            settings=wandb.Settings(console="off", silent=True, init_timeout=60),
        )
        self.run_id = str(self.run.id)
        offline = settings.wandb_mode == "offline"
        self.where = (f"W&B run {self.run_id} (offline: upload with `wandb sync {self.run.dir.rsplit('/', 1)[0]}`)"
                      if offline else f"W&B run {self.run_id}: {self.run.url}")

    def log(self, points: list[tuple[str, float, int]]) -> None:
        by_step: dict[int, dict[str, float]] = {}
        for key, value, step in points:
            by_step.setdefault(step, {})[key] = value
        for step in sorted(by_step):
            self.run.log(by_step[step], step=step)

    def summary(self, values: Mapping[str, float]) -> None:
        self.run.summary.update(dict(values))

    def files(self, run_dir: Path, paths: list[Path]) -> None:
        """One artifact of type model, `rlcli-<run id>`, with the files at their run-dir paths (`.hydra` as
        `hydra`). An artifact rather than `run.save`: W&B copies it, so later checkpoint pruning cannot break it."""
        import wandb

        artifact = wandb.Artifact(f"rlcli-{self.run_id}", type="model",
                                  metadata={"run_dir": str(run_dir)})
        for path in paths:
            artifact.add_file(str(path), name=path.relative_to(run_dir).as_posix().lstrip("."))
        self.run.log_artifact(artifact)

    def finish(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)


SINKS: dict[str, Callable[[TrackingSettings, RunInfo, str | None], Sink]] = {"mlflow": MlflowSink, "wandb": WandbSink}
