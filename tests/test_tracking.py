"""MLflow and W&B tracking: what each receives is read back with the library's own client (MLflow's tracking
client; W&B's offline run file, parsed with W&B's protobuf records) and compared with TensorBoard's scalars."""

import json
import os
import struct
import subprocess
from pathlib import Path

import forked_cli
import pytest
from conftest import RL_TRAIN
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlcli.services.tracking import Tracking
from rlcli.services.tracking_sinks import flat_params

TINY = ["train.total_steps=2048", "train.num_envs=2", "algo.n_steps=128", "algo.batch_size=64",
        "train.test_every=1024", "train.test_episodes=2", "train.checkpoint_every=512", "log.console=false",
        "deterministic=true"]


def tracked_env(tmp_path: Path) -> dict[str, str]:
    """W&B writes nothing outside tmp_path (its data, cache and config dirs), and has no key: offline only."""
    env = dict(os.environ, WANDB_DATA_DIR=str(tmp_path / "wb-data"), WANDB_CACHE_DIR=str(tmp_path / "wb-cache"),
               WANDB_CONFIG_DIR=str(tmp_path / "wb-config"), HOME=str(tmp_path))
    for key in ("WANDB_API_KEY", "MLFLOW_TRACKING_URI", "WANDB_MODE"):
        env.pop(key, None)
    return env


def rl_train(args: list[str], tmp_path: Path, env: dict[str, str] | None = None,
             timeout: float = 300) -> subprocess.CompletedProcess:
    """`rl-train args` in `tmp_path` with `tracked_env` (or `env`), forked from the process that imported rlcli once
    (tests/forked_cli.py: 2 s less of start-up each) although its environment differs from that process's: what
    differs (HOME, W&B's folders, MLflow's URI, a PYTHONPATH put on sys.path) is read by wandb and mlflow, which the
    run imports after the fork (forked_cli.PRELOAD imports neither), and by rlcli while it runs.
    `RLCLI_TESTS_REAL_PROCESSES=1` makes each a fresh process."""
    env = tracked_env(tmp_path) if env is None else env
    if not forked_cli.forkable(args, dict(os.environ)):
        return subprocess.run([str(RL_TRAIN), *args], cwd=tmp_path, capture_output=True, text=True,
                              timeout=timeout, env=env)
    proc = forked_cli.ForkedRun("rl-train", args, tmp_path, env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return subprocess.CompletedProcess([str(RL_TRAIN), *args], proc.wait(), out, err)


def tensorboard_scalars(run_dir: Path) -> dict[str, dict[int, float]]:
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def mlflow_scalars(uri: str, run_id: str, tags: list[str]) -> dict[str, list[tuple[int, float]]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    return {tag: sorted((m.step, m.value) for m in client.get_metric_history(run_id, tag)) for tag in tags}


def wandb_records(run_dir: Path) -> list:
    """Every record of the run's offline `.wandb` files (LevelDB log blocks of W&B's protobuf `Record`)."""
    from wandb.proto import wandb_internal_pb2

    records = []
    for path in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        data, pos, pending = path.read_bytes(), 7, b""
        assert data[:4] == b":W&B"
        while pos + 7 <= len(data):
            if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
                pos += 32768 - pos % 32768
                continue
            _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
            chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
            if kind in (1, 2):  # full / first
                pending = chunk
            elif kind in (3, 4):  # middle / last
                pending += chunk
            if kind in (1, 4):
                record = wandb_internal_pb2.Record()
                record.ParseFromString(pending)
                records.append(record)
    return records


def wandb_scalars(records: list) -> dict[str, list[tuple[int, float]]]:
    series: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            for key, value in items.items():
                if not key.startswith("_"):
                    series.setdefault(key, []).append((int(items["_step"]), float(value)))
    return series


def assert_same_as_tensorboard(tracked: dict[str, list[tuple[int, float]]], tb: dict[str, dict[int, float]]) -> None:
    """The same tags at the same steps, each step once, with the same values. Wall-clock tags (time/*) are
    excepted from the values: after a resume, TensorBoard holds the resumed process's timings for the steps it
    recomputed, the trackers the first process's (they skipped what they already had)."""
    assert set(tracked) == set(tb), set(tracked) ^ set(tb)
    for tag, points in tracked.items():
        steps = [s for s, _ in points]
        assert steps == sorted(set(steps)), f"{tag}: a step logged twice or out of order: {steps}"
        assert steps == sorted(tb[tag]), tag
        for step, value in points if not tag.startswith("time/") else []:
            assert value == pytest.approx(tb[tag][step], rel=1e-6, abs=1e-6), (tag, step)  # TensorBoard is float32


@pytest.mark.slow
def test_mlflow_and_wandb_receive_what_tensorboard_receives_and_resume_logs_nothing_twice(tmp_path):
    run_dir = tmp_path / "run"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracked = ["log.mlflow=true", f"log.mlflow_uri={uri}", "log.wandb=true", "log.wandb_mode=offline"]
    out = rl_train([*TINY, *tracked, f"hydra.run.dir={run_dir}"], tmp_path)
    assert out.returncode == 0, out.stderr
    state = json.loads((run_dir / "tracking.json").read_text())
    assert state["mlflow"]["sent_through"] == state["wandb"]["sent_through"] == 2048

    # a resume from the checkpoint at 1,024 recomputes 1,024..2,048 exactly: nothing may reach a tracker twice
    out = rl_train([f"resume={run_dir / 'checkpoints' / 'ckpt_000000001024.pt'}"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert "(continued)" in (run_dir / "train.log").read_text()
    assert json.loads((run_dir / "tracking.json").read_text()) == state  # the same runs, the same high-water marks

    tb = tensorboard_scalars(run_dir)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    run = client.get_run(state["mlflow"]["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.tags["algo"] == "ppo" and run.data.tags["env"] == "CartPole-v1" and run.data.tags["seed"] == "1"
    assert run.data.params["algo.n_steps"] == "128" and run.data.params["train.num_envs"] == "2"
    assert client.get_experiment(run.info.experiment_id).name == "ppo-CartPole-v1"
    final_test = tb["eval/return_mean"][max(tb["eval/return_mean"])]
    assert run.data.metrics["final/test_return"] == pytest.approx(final_test, rel=1e-6)
    history = mlflow_scalars(uri, run.info.run_id, list(tb))
    assert_same_as_tensorboard(history, tb)
    artifacts = {a.path for folder in ("", "hydra", "checkpoints")
                 for a in client.list_artifacts(run.info.run_id, folder)}
    assert {"hydra/config.yaml", "hydra/overrides.yaml", "checkpoints/best.pt",
            "checkpoints/ckpt_000000002048.pt"} <= artifacts

    records = wandb_records(run_dir)
    assert len(list(run_dir.glob("wandb/offline-run-*"))) == 2  # the first process and the resumed one
    runs = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert {r.run_id for r in runs} == {state["wandb"]["run_id"]}
    config = {u.key: json.loads(u.value_json) for u in runs[0].config.update}
    assert config["algo"]["n_steps"] == 128 and config["seed"] == 1
    assert_same_as_tensorboard(wandb_scalars(records), tb)
    summary = {u.key or "/".join(u.nested_key): json.loads(u.value_json)
               for r in records if r.WhichOneof("record_type") == "summary" for u in r.summary.update}
    assert summary["final/test_return"] == pytest.approx(final_test, rel=1e-6)
    artifact_files = {e.path for r in records if r.WhichOneof("record_type") == "artifact"
                      for e in r.artifact.manifest.contents}
    assert {"hydra/config.yaml", "checkpoints/best.pt", "checkpoints/ckpt_000000002048.pt"} <= artifact_files


@pytest.mark.slow
def test_a_sweep_groups_its_tracked_runs_and_mlflow_defaults_to_its_own_local_store(tmp_path):
    out = rl_train(["-m", "seed=1,2", "train.total_steps=512", "train.num_envs=2", "algo.n_steps=128",
                    "algo.batch_size=64", "train.test_every=0", "log.console=false", "log.mlflow=true",
                    "log.mlflow_experiment=sweep-test", "log.wandb=true", "log.wandb_mode=offline",
                    f"hydra.sweep.dir={tmp_path / 'sweep'}"], tmp_path)
    assert out.returncode == 0, out.stderr
    # rlcli's default store: in ./runs (the sweep's jobs are under no folder named runs), not the working directory
    assert (tmp_path / "runs" / "mlflow.db").is_file() and not (tmp_path / "mlflow.db").exists()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("sweep-test")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.data.tags["seed"] for r in runs) == ["1", "2"]
    assert {r.data.tags["rlcli.sweep"] for r in runs} == {str(tmp_path / "sweep")}
    groups = {r.run.run_group for job in ("0", "1") for r in wandb_records(tmp_path / "sweep" / job)
              if r.WhichOneof("record_type") == "run"}
    assert groups == {str(tmp_path / "sweep")}


FAILING_STARTS = [
    (["log.mlflow=true", "log.mlflow_uri=http://127.0.0.1:9"], "log.mlflow_uri='http://127.0.0.1:9'",
     "does not answer"),
    (["log.wandb=true"], "log.wandb_mode=online needs a W&B API key", "log.wandb_mode=offline"),
    (["log.wandb=true", "log.wandb_mode=cloud"], "log.wandb_mode='cloud'", "choose from: online, offline"),
    (["log.mlflow=yes"], "log.mlflow='yes'", "expected true or false"),
]


@pytest.mark.parametrize(("args", "names", "allowed"), FAILING_STARTS, ids=[" ".join(a) for a, _, _ in FAILING_STARTS])
def test_a_tracker_that_cannot_start_is_one_line_before_any_run_dir(args, names, allowed, tmp_path):
    out = rl_train([*args, "log.console=false"], tmp_path)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0].startswith("rl-train: error: ") and names in lines[0] and allowed in lines[0], lines[0]
    assert not (tmp_path / "runs").exists()


def test_a_missing_tracking_package_names_the_extra(tmp_path):
    blocker = tmp_path / "blocked"
    (blocker / "mlflow").mkdir(parents=True)
    (blocker / "mlflow" / "__init__.py").write_text("raise ImportError(\"No module named 'mlflow'\")\n")
    env = dict(tracked_env(tmp_path), PYTHONPATH=str(blocker))
    out = rl_train(["log.mlflow=true"], tmp_path, env=env, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        "rl-train: error: log.mlflow=true needs mlflow, which is not installed (No module named 'mlflow'): "
        "pip install -e '.[mlflow]'"]


class RecordingSink:
    name = "Fake"
    run_id = "fake-1"

    def __init__(self, fail_on_call: int | None = None) -> None:
        self.points: list[tuple[str, float, int]] = []
        self.calls, self.fail_on_call, self.status = 0, fail_on_call, None

    def log(self, points):
        self.calls += 1
        if self.calls == self.fail_on_call:
            raise ConnectionError("server went away\nsecond line")
        self.points += points

    def summary(self, values):
        self.summary_values = dict(values)

    def files(self, run_dir, paths):
        self.paths = paths

    def finish(self, status):
        self.status = status


def test_tracking_sends_each_step_once_from_where_the_sink_left_off(tmp_path):
    sink, warnings = RecordingSink(), []
    tracking = Tracking({"fake": sink}, tmp_path, {"fake": 200}, warnings.append)  # the stopped run sent up to 200
    for step in (100, 200, 300):
        tracking.scalars({"a": step / 100, "nan": float("nan")}, step)
    tracking.flush()
    assert sink.points == [("a", 3.0, 300)]  # 100 and 200 were sent before; nan is never sent (as TensorBoard)
    assert json.loads((tmp_path / "tracking.json").read_text()) == {"fake": {"run_id": "fake-1", "sent_through": 300}}
    tracking.finish("FINISHED", {"final/test_return": 1.0}, [tmp_path / "tracking.json", tmp_path / "missing"])
    assert sink.status == "FINISHED" and sink.summary_values == {"final/test_return": 1.0}
    assert sink.paths == [tmp_path / "tracking.json"] and not warnings


def test_a_sink_that_fails_mid_run_is_one_warning_and_the_others_go_on(tmp_path):
    failing, healthy, warnings = RecordingSink(fail_on_call=2), RecordingSink(), []
    tracking = Tracking({"bad": failing, "good": healthy}, tmp_path, {"bad": 0, "good": 0}, warnings.append)
    for step in (1, 2, 3):
        tracking.scalars({"a": float(step)}, step)
        tracking.flush()
    tracking.finish("FINISHED")
    assert [p[2] for p in healthy.points] == [1, 2, 3] and healthy.status == "FINISHED"
    assert [p[2] for p in failing.points] == [1] and failing.status is None
    assert warnings == ["Fake logging failed (ConnectionError: server went away); training goes on with "
                        "TensorBoard and the other sinks"]


def test_flat_params_names_every_leaf_by_its_dotted_key():
    assert flat_params({"algo": {"lr": 3e-4, "net": [64, 64]}, "seed": 1, "resume": None, "empty": {}}) == {
        "algo.lr": "0.0003", "algo.net": "[64, 64]", "seed": "1", "resume": "null", "empty": "{}"}


def test_a_tracker_that_fails_to_start_a_run_ends_a_run_in_one_line_and_only_fails_a_sweeps_job(tmp_path, capsys):
    """The store passes the start-up check (not a server) but cannot open: exit 2 with one line for a run, a
    ConfigError (the job's failed status) for a sweep's job, so that the other jobs go on."""
    from rlcli.registry import ConfigError
    from rlcli.run.compose import compose_config
    from rlcli.run.state import prepare
    from rlcli.run.trainer import Trainer, TrainerOptions

    (tmp_path / "a-file").write_text("")  # the store's folder cannot be made: a file is in the way
    args = ["log.mlflow=true", f"log.mlflow_uri=sqlite:///{tmp_path}/a-file/mlflow.db", "log.console=false",
            "train.total_steps=256"]
    (tmp_path / "run").mkdir()
    (tmp_path / "job").mkdir()
    components, state = prepare(compose_config(args))
    with pytest.raises(SystemExit) as stop:
        Trainer(components, tmp_path / "run", state).run()
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rl-train: error: log.mlflow=true: MLflow could not start a run"), err
    components, state = prepare(compose_config(args))
    job = Trainer(components, tmp_path / "job", state, TrainerOptions(sweep_group=str(tmp_path)))
    with pytest.raises(ConfigError, match="MLflow could not start a run"):
        job.run()
