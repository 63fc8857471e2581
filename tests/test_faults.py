"""The faults real runs meet: crafted checkpoints and run directories, divergence, two processes on one run,
torn records, filesystem faults, misbehaving envs and fuzzed values. Each is one line and a non-zero exit
code (or survived), and no good checkpoint is lost."""

import collections
import hashlib
import io
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import forked_cli
import numpy as np
import pytest
import torch
from conftest import RL_TRAIN

from rlcli.services import checkpoint, jsonl, plain_state

RL_EVAL = Path(sys.executable).parent / "rl-eval"
RL_REPORT = Path(sys.executable).parent / "rl-report"
FAULT_ENVS = Path(__file__).parent / "fault_envs"
BASE = ["train.num_envs=4", "train.test_every=512", "train.test_episodes=2", "train.checkpoint_every=512",
        "log.console=false", "train.stop_reward=null"]
SMALL = ["algo=ppo", "env=CartPole-v1", "algo.n_steps=64", *BASE]


def run(cmd: Path, *args: str, cwd: Path, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, HYDRA_FULL_ERROR="0", PYTHONPATH=os.pathsep.join(
        [str(FAULT_ENVS), *filter(None, [os.environ.get("PYTHONPATH")])]))
    if cmd.name in forked_cli.ENTRIES and not kw:  # (a preexec_fn's limits need a process of its own)
        return forked_cli.run(args, cwd, timeout=timeout, env=env, program=cmd.name)
    return subprocess.run([str(cmd), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env, **kw)


def one_line(out: subprocess.CompletedProcess, code: int | None = None) -> str:
    lines = [line for line in out.stderr.splitlines() if line.strip() and "warn" not in line.lower()]
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr
    if code is not None:
        assert out.returncode == code, out.stderr
    return lines[0]


@pytest.fixture(scope="module")
def good_run(tmp_path_factory) -> Path:
    """A finished run with three checkpoints and a best model (copied by the tests that change it)."""
    where = tmp_path_factory.mktemp("good")
    out = run(RL_TRAIN, *SMALL, "train.total_steps=2048", "hydra.run.dir=run", cwd=where)
    assert out.returncode == 0, out.stderr
    return where / "run"


@pytest.fixture
def run_copy(good_run, tmp_path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(good_run, target, ignore=shutil.ignore_patterns(".rlcli.lock"))
    return target


# --------------------------------------------------------------------------- plain state (no pickle)
def test_plain_state_round_trips_what_a_run_holds():
    generator = np.random.default_rng(3)
    generator.random(5)
    value = {"f32": np.arange(6, dtype=np.float32).reshape(2, 3), "u8": np.ones((2, 2), np.uint8),
             "bools": np.array([True, False]), "u32": np.array([2**32 - 1], np.uint32), "scalar": np.float64(1.5),
             "i64": np.int64(-7), "queue": collections.deque([1.0, 2.0], maxlen=3), "tuple": (1, "a", None),
             "rng": generator, "legacy": np.random.RandomState(5), "t": torch.arange(3), "big": 2**100,
             # empty arrays and bytes: pickle writes b"" as a call to bytes(), which weights_only refuses
             "empty": np.zeros((0, 3), np.float32), "empty_i": np.zeros(0, np.int64), "no_bytes": b""}
    buffer = io.BytesIO()
    torch.save(plain_state.encode(value, objects=True), buffer)
    buffer.seek(0)
    back = plain_state.decode(torch.load(buffer, weights_only=True))
    for key in ("f32", "u8", "bools", "u32", "empty", "empty_i"):
        assert back[key].dtype == value[key].dtype and np.array_equal(back[key], value[key])
    assert type(back["scalar"]) is np.float64 and back["scalar"] == 1.5 and type(back["i64"]) is np.int64
    assert back["queue"] == value["queue"] and back["queue"].maxlen == 3
    assert back["tuple"] == (1, "a", None) and back["big"] == 2**100 and torch.equal(back["t"], value["t"])
    assert back["empty"].shape == (0, 3) and back["no_bytes"] == b""
    assert back["rng"].random() == generator.random()  # the stream continues exactly
    assert back["legacy"].randint(1000) == value["legacy"].randint(1000)


def test_objects_are_restored_into_existing_ones_never_built_from_a_name():
    from gymnasium.wrappers.utils import RunningMeanStd

    stats = RunningMeanStd(shape=(2,))
    stats.update(np.array([[1.0, 2.0], [3.0, 5.0]]))
    record = plain_state.decode(plain_state.encode(stats, objects=True))
    assert isinstance(record, dict)  # a record, not an object: nothing is instantiated from the file
    fresh = RunningMeanStd(shape=(2,))
    assert plain_state.restore_into(fresh, record) is fresh
    assert np.array_equal(fresh.mean, stats.mean) and np.array_equal(fresh.var, stats.var)
    with pytest.raises(ValueError, match="expected a"):
        plain_state.restore_into(collections.Counter(), record)
    with pytest.raises(plain_state.Unsupported):
        plain_state.encode(np.array([object()]))
    with pytest.raises(ValueError, match="bit generator"):
        plain_state.decode({plain_state.TAG: "np_generator", "state": {"bit_generator": "os.system"}})


# --------------------------------------------------------------------------- crafted checkpoints
class Payload:
    """Unpickling this runs a command (what a crafted checkpoint would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def crafted(path: Path, marker: Path, version: int, base: dict | None = None) -> Path:
    """A checkpoint with a valid header and checksum whose payload runs a command when unpickled."""
    data = dict(base or {"env_steps": 1})
    data["evil"] = Payload(marker)
    buffer = io.BytesIO()
    torch.save(data, buffer)
    body = buffer.getvalue()
    path.write_bytes(checkpoint._HEADER.pack(checkpoint.MAGIC, version, hashlib.sha256(body).digest()) + body)
    return path


@pytest.mark.parametrize("version", [checkpoint.FORMAT_VERSION, checkpoint.PICKLE_FORMAT])
def test_a_crafted_checkpoint_never_runs_code_through_any_reader(run_copy, tmp_path, version):
    marker = tmp_path / "PWNED"
    ckpts = run_copy / "checkpoints"
    evil = crafted(ckpts / "evil.pt", marker, version)  # in a run's checkpoints/, so resume=<file> reads it
    newest = sorted(ckpts.glob("ckpt_*.pt"))[-1]
    refused = [
        (RL_EVAL, [str(evil)]),                                              # rl-eval <file>
        (RL_TRAIN, [f"resume={evil}"]),                                      # resume=<file>
        (RL_TRAIN, [*SMALL, "train.total_steps=512", f"actor.init_from={evil}", "hydra.run.dir=w1"]),
        (RL_TRAIN, [*SMALL, "train.total_steps=512", "hydra.run.dir=w2",    # the kl_prior add-on
                    f"+algo.policy_loss_addons.kl_prior.checkpoint={evil}"]),
    ]
    for cmd, args in refused:
        out = run(cmd, *args, cwd=tmp_path)
        assert out.returncode == 2, (args, out.stderr)
        line = one_line(out)
        assert str(evil) in line and ("format 1" in line or "other than tensors" in line), line
        assert not marker.exists(), args
    # rl-eval <run> reads best.pt; resume=<dir> reads the newest checkpoint
    evil.unlink()
    shutil.copy(crafted(tmp_path / "evil_best.pt", marker, version), ckpts / "best.pt")
    out = run(RL_EVAL, str(run_copy), cwd=tmp_path)
    assert out.returncode == 2 and "best.pt" in one_line(out) and not marker.exists()
    # a good run whose best.pt was replaced resumes (the later best is dropped, never read as code)
    out = run(RL_TRAIN, f"resume={run_copy}", "train.total_steps=2560", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert not marker.exists()
    crafted(newest, marker, version)
    (ckpts / "latest").write_text(newest.name + "\n")
    out = run(RL_TRAIN, f"resume={run_copy}", "train.total_steps=4096", cwd=tmp_path)
    assert not marker.exists(), out.stderr
    if version == checkpoint.FORMAT_VERSION:
        assert out.returncode == 2 and "other than tensors" in one_line(out)


def test_a_format_1_checkpoint_is_read_only_with_trusted_checkpoint(good_run, tmp_path):
    data = checkpoint.load(good_run / "checkpoints" / "best.pt")
    data.pop("format")
    buffer = io.BytesIO()
    torch.save(data, buffer)  # the old layout: a full pickle
    body = buffer.getvalue()
    old = tmp_path / "old.pt"
    old.write_bytes(checkpoint._HEADER.pack(checkpoint.MAGIC, 1, hashlib.sha256(body).digest()) + body)
    out = run(RL_EVAL, str(old), "episodes=2", cwd=tmp_path)
    assert out.returncode == 2 and "trusted_checkpoint=true" in one_line(out)
    out = run(RL_EVAL, str(old), "episodes=2", "trusted_checkpoint=true", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    out = run(RL_TRAIN, f"resume={old}", "trusted_checkpoint=true", cwd=tmp_path)
    assert out.returncode == 2 and "format 1" in one_line(out)  # never resumed


def test_a_checkpoint_without_its_config_is_one_line(run_copy, tmp_path):
    data = checkpoint.load(run_copy / "checkpoints" / "ckpt_000000002048.pt")
    del data["config"], data["format"]
    partial = checkpoint.write(run_copy / "checkpoints" / "partial.pt", data.pop("env_steps"), data)
    for cmd, args in ((RL_EVAL, [str(partial)]), (RL_TRAIN, [f"resume={partial}"])):
        out = run(cmd, *args, cwd=tmp_path)
        assert out.returncode == 2 and "'config'" in one_line(out)


def test_resume_replays_only_rlcli_keys(run_copy, tmp_path):
    saved = run_copy / ".hydra" / "overrides.yaml"
    stolen = tmp_path / "stolen"
    saved.write_text(saved.read_text() + f"- +hydra.callbacks.x._target_=shutil.copyfile\n"
                     f"- +hydra.callbacks.x.src={saved}\n- +hydra.callbacks.x.dst={stolen}\n")
    out = run(RL_TRAIN, f"resume={run_copy}", "train.total_steps=4096", cwd=tmp_path)
    line = one_line(out, code=2)
    assert "+hydra.callbacks.x._target_=shutil.copyfile" in line and "not an rlcli setting" in line
    assert not stolen.exists()


# --------------------------------------------------------------------------- divergence
@pytest.mark.parametrize("algo", [["algo=ppo", "env=CartPole-v1", "algo.n_steps=64"],
                                  ["algo=sac", "env=Pendulum-v1", "algo.learning_starts=256", "algo.batch_size=64",
                                   "actor.hidden_sizes=[32,32]"]])
def test_divergence_stops_in_one_line_and_keeps_the_good_checkpoints(algo, tmp_path):
    args = [*BASE, *algo, "train.total_steps=4096", "algo.schedules.lr=step:0.0003:1e30:0.5", "hydra.run.dir=run"]
    out = run(RL_TRAIN, *args, cwd=tmp_path)
    line = one_line(out, code=1)
    assert "non-finite" in line and "env steps" in line and "last good checkpoint is checkpoints/ckpt_" in line
    kept = sorted((tmp_path / "run" / "checkpoints").glob("ckpt_*.pt"))
    assert kept and all(int(p.stem.split("_")[1]) <= 2048 for p in kept)
    for path in [*kept, tmp_path / "run" / "checkpoints" / "best.pt"]:
        weights = checkpoint.load(path)["algo"]
        flat = [v for v in _tensors(weights) if v.is_floating_point()]
        assert flat and all(torch.isfinite(v).all() for v in flat), path
    assert run(RL_EVAL, str(tmp_path / "run"), "load=last", "episodes=1", cwd=tmp_path).returncode == 0


def _tensors(node):
    if isinstance(node, torch.Tensor):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from _tensors(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            yield from _tensors(value)


@pytest.mark.parametrize("policy", ["skip", "rollback"])
def test_skip_and_rollback_are_counted_then_stop(policy, tmp_path):
    args = [*SMALL, "train.total_steps=4096", "algo.schedules.lr=step:0.0003:1e30:0.5", "hydra.run.dir=run",
            f"train.on_nonfinite={policy}", "train.max_nonfinite=2"]
    out = run(RL_TRAIN, *args, cwd=tmp_path)
    assert out.returncode == 1 and "more than train.max_nonfinite=2" in out.stderr.splitlines()[-1]
    log = (tmp_path / "run" / "train.log").read_text()
    word = "the update was undone" if policy == "skip" else "rolled back to ckpt_"
    assert log.count(word) == 2


def test_rl_eval_and_export_refuse_nonfinite_weights(good_run, tmp_path):
    data = checkpoint.load(good_run / "checkpoints" / "best.pt")
    next(t for t in _tensors(data["algo"]["networks"]) if t.is_floating_point()).fill_(float("nan"))
    data.pop("format")
    path = checkpoint.write(tmp_path / "nan.pt", data.pop("env_steps"), data)
    for extra in ([], ["export=torchscript"]):
        out = run(RL_EVAL, str(path), *extra, cwd=tmp_path)
        assert "non-finite network weights" in one_line(out, code=2)


# --------------------------------------------------------------------------- one process per run dir
def test_a_second_process_on_a_run_dir_is_refused_and_a_killed_holder_does_not_block(tmp_path):
    first = subprocess.Popen([str(RL_TRAIN), *SMALL, "train.total_steps=400000", "hydra.run.dir=run", "resume=auto"],
                             cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not (tmp_path / "run" / "checkpoints" / "latest").exists():
            assert first.poll() is None and time.time() < deadline, first.communicate()
            time.sleep(0.1)
        out = run(RL_TRAIN, *SMALL, "train.total_steps=400000", "hydra.run.dir=run", "resume=auto", cwd=tmp_path)
        line = one_line(out, code=2)
        assert f"pid {first.pid}" in line and "in use" in line
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    steps_before = max(int(p.stem.split("_")[1]) for p in (tmp_path / "run" / "checkpoints").glob("ckpt_*.pt"))
    out = run(RL_TRAIN, *SMALL, f"train.total_steps={steps_before + 512}", "hydra.run.dir=run", "resume=auto",
              cwd=tmp_path)
    assert out.returncode == 0, out.stderr  # the killed holder's lock died with it
    steps = [r["env_steps"] for r in jsonl.read_records(tmp_path / "run" / "eval.jsonl")]
    assert steps == sorted(set(steps))


# --------------------------------------------------------------------------- torn records
def test_jsonl_drops_a_torn_last_record_and_appends_whole_ones(tmp_path):
    path = tmp_path / "eval.jsonl"
    path.write_text('{"env_steps": 1}\n{"env_steps": 2}\n{"env_st')
    warnings = []
    assert jsonl.read_records(path, warn=warnings.append) == [{"env_steps": 1}, {"env_steps": 2}]
    assert len(warnings) == 1 and "torn" in warnings[0]
    jsonl.append_record(path, {"env_steps": 3})
    assert path.read_text() == '{"env_steps": 1}\n{"env_steps": 2}\n{"env_steps": 3}\n'
    path.write_text('{"env_steps": 1}\n{"env_steps": 2}')  # parses, but lacks its newline: torn all the same
    assert jsonl.read_records(path) == [{"env_steps": 1}]


def test_a_torn_eval_record_does_not_brick_resume_or_report(run_copy, tmp_path):
    with open(run_copy / "eval.jsonl", "a") as f:
        f.write('{"env_steps": 9999, "retu')
    out = run(RL_TRAIN, f"resume={run_copy}", "train.total_steps=2560", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in (run_copy / "eval.jsonl").read_text().splitlines()]
    steps = [r["env_steps"] for r in records]
    assert steps == sorted(set(steps)) and steps[-1] == 2560
    with open(run_copy / "eval.jsonl", "a") as f:
        f.write('{"env_steps": 9999, "retu')
    out = run(RL_REPORT, str(run_copy), cwd=tmp_path)
    assert out.returncode == 0 and "torn" in out.stderr


# --------------------------------------------------------------------------- filesystem faults
def _limit_file_size(limit: int):
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_a_file_size_limit_is_one_line_and_leaves_no_partial_file(tmp_path):
    out = run(RL_TRAIN, *SMALL, "train.total_steps=2048", "hydra.run.dir=run", cwd=tmp_path,
              preexec_fn=_limit_file_size(40_000))
    line = one_line(out, code=1)
    assert "cannot write" in line and "/run/" in line and "File too large" in line
    assert not list((tmp_path / "run").rglob("*.tmp"))
    for path in (tmp_path / "run" / "checkpoints").glob("ckpt_*.pt"):
        checkpoint.verify(path)  # whatever is under a final name is whole


def test_the_run_dir_deleted_while_training_is_one_line(tmp_path):
    proc = subprocess.Popen([str(RL_TRAIN), *SMALL, "train.total_steps=409600", "hydra.run.dir=run"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (tmp_path / "run" / "checkpoints" / "latest").exists():
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.1)
    # As `rm -rf` run again would: the run may write a new file between rmtree's listing and its rmdir
    # (CI once failed with "Directory not empty"), so delete until the directory is gone.
    for _ in range(50):
        shutil.rmtree(tmp_path / "run", ignore_errors=True)
        if not (tmp_path / "run").exists():
            break
        time.sleep(0.05)
    assert not (tmp_path / "run").exists()
    _, err = proc.communicate(timeout=120)
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 1 and len(lines) == 1 and "cannot write" in lines[0], err
    assert not (tmp_path / "run").exists()  # not silently re-created with only checkpoints in it


def closed_stdout_run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """A command whose stdout reader has already exited, as in `rl-train ... | head -1`."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([*args], cwd=cwd, stdout=write, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write)


def test_a_closed_stdout_does_not_end_a_run(tmp_path):
    out = closed_stdout_run(str(RL_TRAIN), "algo=ppo", "env=CartPole-v1", "algo.n_steps=64", "train.num_envs=4",
                            "train.total_steps=1024", "train.checkpoint_every=512", "train.stop_reward=null",
                            "hydra.run.dir=run", cwd=tmp_path)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.count("stdout was closed") == 1, out.stderr
    assert (tmp_path / "run" / "checkpoints" / "ckpt_000000001024.pt").exists()
    assert "done: 1,024 env steps" in (tmp_path / "run" / "train.log").read_text()


def test_a_closed_stdout_and_stderr_do_not_end_a_run(tmp_path):
    """`rl-train ... 2>&1 | head -2`: both streams' reader gone. The run went on to its end (exit 1 with only best.pt
    once: rich quit on stderr's broken pipe)."""
    read, write = os.pipe()
    os.close(read)
    try:
        out = subprocess.run([str(RL_TRAIN), "algo=ppo", "env=CartPole-v1", "algo.n_steps=64", "train.num_envs=4",
                              "train.total_steps=1024", "train.log_every=256", "train.stop_reward=null",
                              "hydra.run.dir=run"], cwd=tmp_path, stdout=write, stderr=write, timeout=300)
    finally:
        os.close(write)
    assert out.returncode == 0
    assert (tmp_path / "run" / "checkpoints" / "ckpt_000000001024.pt").exists()
    assert "done: 1,024 env steps" in (tmp_path / "run" / "train.log").read_text()


@pytest.mark.parametrize("command", ["rl-train", "rl-eval", "rl-report"])
def test_help_into_a_closed_stdout_ends_quietly(command, tmp_path):
    out = closed_stdout_run(str(Path(sys.executable).parent / command), "--help", cwd=tmp_path)
    assert out.returncode in (0, 128 + signal.SIGPIPE) and out.stderr == "", out.stderr


def test_stale_temporaries_are_removed_when_a_run_starts(run_copy, tmp_path):
    (run_copy / "checkpoints" / "ckpt_000000009999.pt.tmp").write_bytes(b"half")
    out = run(RL_TRAIN, f"resume={run_copy}", "train.total_steps=2560", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert not list(run_copy.rglob("*.tmp"))


def test_rl_eval_and_rl_report_into_a_missing_directory(good_run, tmp_path):
    out = run(RL_REPORT, str(good_run), "--csv", str(tmp_path / "missing" / "table.csv"), cwd=tmp_path)
    assert "missing" in one_line(out, code=2)


# --------------------------------------------------------------------------- misbehaving envs
@pytest.mark.parametrize(("fault", "expected", "code"), [
    ("raise", "raised RuntimeError: simulator exploded at env step", 1),
    ("nan_obs", "returned a non-finite observation", 1),
    ("inf_reward", "returned a non-finite reward (env 0: inf)", 1),
    ("bad_shape_step", "at env step", 1),
    ("bad_shape_reset", "at reset", 2),
])
def test_a_misbehaving_env_is_one_line_naming_it(fault, expected, code, tmp_path):
    out = run(RL_TRAIN, *SMALL, "env=gym", "env.id=faulty_env:Faulty-v0", f"+env.kwargs.fault={fault}",
              "+env.kwargs.at=400", "train.num_envs=2", "train.total_steps=4096", "hydra.run.dir=run", cwd=tmp_path)
    line = one_line(out, code=code)
    assert "Faulty-v0" in line and expected in line, line
    if code == 1:
        assert "last good checkpoint is checkpoints/ckpt_000000000512.pt" in line and "rl-train resume=" in line


# --------------------------------------------------------------------------- fuzzed values
@pytest.mark.parametrize(("args", "expected"), [
    (["seed=-1"], "seed=-1 is invalid"),
    ([f"seed={2**70}"], "2**32 - 1"),
    (["torch_threads=-1"], "torch_threads=-1 is invalid"),
    (["algo.n_steps=10000000000"], "lower algo.n_steps"),
    (["actor.hidden_sizes=[100000,100000]"], "lower actor.hidden_sizes"),
    (["algo=dqn", "buffer.capacity=10000000000"], "lower buffer.capacity"),
    (["train.on_nonfinite=ignore"], "choose from: stop, skip, rollback"),
])
def test_fuzzed_values_are_one_line(args, expected, tmp_path):
    out = run(RL_TRAIN, *args, cwd=tmp_path)
    assert expected in one_line(out, code=2)
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "runs").exists()


def test_rl_eval_refuses_a_bad_seed(good_run, tmp_path):
    assert "seed=-1 is invalid" in one_line(run(RL_EVAL, str(good_run), "seed=-1", cwd=tmp_path), code=2)


@pytest.fixture
def read_only_dir(tmp_path, good_run):
    """A directory this process cannot write, holding a copy of the good run: a read-only tmpfs as root (root
    ignores permissions), else chmod."""
    where = tmp_path / "ro"
    where.mkdir()
    if os.geteuid() != 0:
        shutil.copytree(good_run, where / "run")
        for path in [where, *where.rglob("*")]:
            path.chmod(0o555 if path.is_dir() else 0o444)
        yield where
        for path in [where, *where.rglob("*")]:
            path.chmod(0o755)
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"root without a way to make a read-only directory here: {mounted.stderr.decode().strip()}")
    shutil.copytree(good_run, where / "run", ignore=shutil.ignore_patterns(".rlcli.lock"))
    subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
    yield where
    subprocess.run(["umount", str(where)], capture_output=True)


def test_a_read_only_working_directory_or_run_dir_is_one_line(read_only_dir, tmp_path):
    out = run(RL_TRAIN, *SMALL, "train.total_steps=512", cwd=read_only_dir)
    assert "cannot write the run directory" in one_line(out, code=2)
    out = run(RL_TRAIN, *SMALL, "train.total_steps=512", f"hydra.run.dir={read_only_dir / 'new'}", cwd=tmp_path)
    assert "cannot write the run directory" in one_line(out, code=2)
    out = run(RL_TRAIN, f"resume={read_only_dir / 'run'}", "train.total_steps=4096", cwd=tmp_path)
    assert "cannot lock the run directory" in one_line(out, code=2)
    for extra in (["episodes=1"], ["export=torchscript"]):
        out = run(RL_EVAL, str(read_only_dir / "run"), *extra, cwd=tmp_path)
        assert out.returncode == 1 and "cannot write" in out.stderr.splitlines()[-1] and "Traceback" not in out.stderr
    out = run(RL_REPORT, str(read_only_dir / "run"), "--csv", str(read_only_dir / "t.csv"), cwd=tmp_path)
    assert "cannot write" in one_line(out, code=1)


def test_check_update_names_what_went_nonfinite():
    from rlcli.run.finite import check_update, nonfinite_weights

    weights = [torch.ones(3, 2), torch.zeros(2), torch.arange(3)]  # an integer buffer is not checked
    assert check_update({"loss": torch.tensor(0.5), "lr": 3e-4}, weights) is None
    assert check_update({"explained_variance": torch.tensor(float("nan"))}, weights) is None  # a diagnostic
    assert "policy_loss" in check_update({"policy_loss": torch.tensor(float("nan")), "v": torch.tensor(1.0)}, weights)
    assert "grad_norm" in check_update({"grad_norm": float("inf")}, weights)
    weights[1][0] = float("-inf")
    assert "weights" in check_update({"loss": torch.tensor(0.5)}, weights)
    assert nonfinite_weights([("a", weights[0]), ("b", weights[1])]) == ["b"]
    assert "weights" in check_update({}, [torch.full((4,), 1e30)])  # beyond float32 in its norm: diverged
