"""rl-train's run-time faults (issue 55): settings the machine cannot honour or that mean nothing, run directories
that cannot be directories, an env that hangs, a first Ctrl-C that must stop any run within seconds, and a run
directory deleted under a run. Each is one line and a non-zero exit code, with the last good checkpoint kept."""

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import forked_cli
import pytest
from conftest import RL_TRAIN
from test_faults import BASE, FAULT_ENVS, SMALL, one_line, run

from rlcli.run.stop import STOP_GRACE_SECONDS
from rlcli.services.runtime import max_torch_threads

HUNG = ["env=gym", "env.id=hung_env:Hung-v0", "train.num_envs=2", "train.total_steps=4096", "hydra.run.dir=run"]


def fault_env() -> dict[str, str]:
    return dict(os.environ, HYDRA_FULL_ERROR="0", PYTHONPATH=os.pathsep.join(
        [str(FAULT_ENVS), *filter(None, [os.environ.get("PYTHONPATH")])]))


def start(*args: str, cwd: Path):
    return forked_cli.start(list(args), cwd, env=fault_env())


def wait_for(predicate, proc, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "the run never got there"
        time.sleep(0.05)


def lines_of(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip() and "warn" not in line.lower()]


# --------------------------------------------------------------------------- values the machine cannot honour
@pytest.mark.parametrize(("args", "expected"), [
    (["torch_threads=100000"], f"torch_threads=100000 is invalid: must be an integer in [1, {max_torch_threads()}]"),
    ([f"torch_threads={max_torch_threads() + 1}"], "4 per usable core"),
    (["deterministic=maybe"], "deterministic='maybe' is invalid: expected true or false"),
    (["trusted_checkpoint=yes please"], "trusted_checkpoint='yes please' is invalid: expected true or false"),
    (["train.stop_reward=nan"], "train.stop_reward=nan is invalid: use a finite number"),
    (["train.stop_reward=inf"], "or null (never stop early)"),
    (["train.num_envs=100000"], "train.num_envs=100000 is invalid: must be in [1, 65536]"),
    (["train.num_envs=5000", "train.vector_mode=async"], "with train.vector_mode=async (one process per env"),
    (["train.step_timeout=-1"], "train.step_timeout=-1 is invalid: use a number of seconds > 0, or null"),
    (["train.test_episodes=100000"], "train.test_episodes=100000 is invalid: must be in [1, 65536]"),
    (["log.console=maybe"], "log.console='maybe' is invalid: expected true or false"),
    (["algo.lr=inf"], "algo.lr=inf is invalid: use a finite number"),
    (["algo=dqn", "algo.max_grad_norm=nan"], "algo.max_grad_norm=nan is invalid: use a finite number"),
    (["hydra.run.dir=/dev/null/x"], "hydra.run.dir=/dev/null/x is invalid: it is under /dev/null, which is a file"),
    (["hydra.run.dir=/dev/null"], "hydra.run.dir=/dev/null is invalid: it is a file"),
    (["hydra.run.dir="], "an empty path would write the run's files into the working directory"),
    (["hydra.run.dir=''"], "hydra.run.dir=''"),
])
def test_nonsense_and_impossible_values_are_one_line(args, expected, tmp_path):
    base = BASE if any(a.startswith("algo=") for a in args) else SMALL
    out = run(RL_TRAIN, *base, "train.total_steps=512", *args, cwd=tmp_path)
    assert expected in one_line(out, code=2)
    assert not list(tmp_path.iterdir())  # nothing written: no run dir, no run files in the working directory


def test_a_run_dir_under_a_file_or_without_permission_is_one_line(tmp_path):
    (tmp_path / "notes.txt").write_text("a file\n")
    out = run(RL_TRAIN, *SMALL, "train.total_steps=512", "hydra.run.dir=notes.txt/run", cwd=tmp_path)
    assert "notes.txt, which is a file" in one_line(out, code=2)
    if os.geteuid() == 0:
        return  # root writes anywhere (a read-only file system is test_faults.py's case)
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        out = run(RL_TRAIN, *SMALL, "train.total_steps=512", f"hydra.run.dir={locked}/run", cwd=tmp_path)
        assert f"cannot write the run directory under {locked}" in one_line(out, code=2)
    finally:
        locked.chmod(0o700)


# --------------------------------------------------------------------------- a hung env
@pytest.mark.parametrize(("how", "mode"), [("sleep", "sync"), ("spin", "sync"),
                                         pytest.param("sleep", "async", marks=pytest.mark.slow)])
def test_a_hung_env_times_out_in_one_line_naming_the_env_and_the_step(how, mode, tmp_path):
    started = time.monotonic()
    out = run(RL_TRAIN, *SMALL, *HUNG, "+env.kwargs.at=400", f"+env.kwargs.how={how}", f"train.vector_mode={mode}",
              "train.step_timeout=1", cwd=tmp_path, timeout=120)
    line = one_line(out, code=1)
    assert "env hung_env:Hung-v0 did not return from a step within train.step_timeout=1 s at env step 8" in line, line
    assert "the last good checkpoint is checkpoints/ckpt_000000000512.pt" in line and "rl-train resume=" in line
    assert time.monotonic() - started < 60
    assert "did not return" in (tmp_path / "run" / "train.log").read_text()


def test_a_hung_test_episode_times_out_too(tmp_path):
    out = run(RL_TRAIN, *SMALL, *HUNG, "+env.kwargs.at=5", "+env.kwargs.where=test", "train.step_timeout=1",
              cwd=tmp_path, timeout=120)
    assert "did not return from a test episode's step within train.step_timeout=1 s" in one_line(out, code=1)


@pytest.mark.parametrize("where", ["train", "test"])
def test_a_hung_env_in_a_population_times_out_each_member_in_one_line(where, tmp_path):
    """train.step_timeout holds in a population too (one process, both members batched: n_jobs=1): each member's
    hung step ends it with its single run's line, whether in its training envs or its test episodes."""
    started = time.monotonic()
    args = ["-m", "hydra/launcher=population", "hydra.launcher.n_jobs=1", "seed=0,1", *SMALL,
            *(a for a in HUNG if not a.startswith("hydra.run.dir")), f"+env.kwargs.where={where}",
            f"+env.kwargs.at={400 if where == 'train' else 5}", "train.step_timeout=1", "hydra.sweep.dir=sw"]
    out = run(RL_TRAIN, *args, cwd=tmp_path, timeout=120)
    assert out.returncode == 1, out.stderr
    what = "a step" if where == "train" else "a test episode's step"
    errors = [line for line in out.stderr.splitlines() if line.startswith("rl-train: error: ")]
    assert len(errors) == 2 and all(f"did not return from {what} within train.step_timeout=1 s" in line
                                    for line in errors), out.stderr
    assert "warning" not in out.stderr  # batched, not the one-at-a-time fallback (whose runs install it themselves)
    assert time.monotonic() - started < 90


# --------------------------------------------------------------------------- the first Ctrl-C stops any run
def _stopped_within_seconds(proc, sig: int = signal.SIGINT) -> tuple[str, float]:
    proc.send_signal(sig)
    sent = time.monotonic()
    _, err = proc.communicate(timeout=60)
    return err, time.monotonic() - sent


def test_the_first_sigint_stops_a_hung_env_within_seconds(tmp_path):
    proc = start(*SMALL, *HUNG, "+env.kwargs.at=300", cwd=tmp_path)  # hangs after the checkpoint at 512
    wait_for(lambda: (tmp_path / "run" / "checkpoints" / "ckpt_000000000512.pt").exists(), proc)
    time.sleep(1.5)  # inside the hung step by now (sleeping: a signal's own handler does not end it)
    err, took = _stopped_within_seconds(proc)
    assert proc.returncode == 128 + signal.SIGINT, err
    assert took < STOP_GRACE_SECONDS + 10, took
    (line,) = lines_of(err)
    assert "SIGINT: the run's next safe point was more than 5 s away: stopped at once" in line, line
    assert "last checkpoint (checkpoints/ckpt_000000000512.pt) with rl-train resume=" in line, line
    assert (tmp_path / "run" / "checkpoints" / "ckpt_000000000512.pt").exists()


@pytest.mark.slow
def test_the_first_sigterm_stops_a_hung_async_env_within_seconds(tmp_path):
    proc = start(*SMALL, *HUNG, "+env.kwargs.at=300", "train.vector_mode=async", cwd=tmp_path)
    wait_for(lambda: (tmp_path / "run" / "checkpoints" / "ckpt_000000000512.pt").exists(), proc)
    time.sleep(1.5)
    err, took = _stopped_within_seconds(proc, signal.SIGTERM)
    assert proc.returncode == 128 + signal.SIGTERM and took < STOP_GRACE_SECONDS + 10, (took, err)
    assert "SIGTERM: the run's next safe point" in lines_of(err)[-1]


def test_the_first_sigint_stops_a_run_whose_iteration_takes_minutes(tmp_path):
    # a huge update (100,000 epochs over each rollout): the loop's next safe point is minutes away
    proc = start(*SMALL, "algo.n_epochs=100000", "train.total_steps=4096", "hydra.run.dir=run", cwd=tmp_path)
    wait_for(lambda: "first env step" in _read(tmp_path / "run" / "train.log"), proc)
    time.sleep(2)
    err, took = _stopped_within_seconds(proc)
    assert proc.returncode == 128 + signal.SIGINT and took < STOP_GRACE_SECONDS + 10, (took, err)
    (line,) = lines_of(err)
    assert "stopped at once, before its first checkpoint (nothing trained is kept)" in line, line
    assert "stopped at once" in _read(tmp_path / "run" / "train.log")  # the run's own record says so too


def test_a_first_sigint_near_a_safe_point_still_saves_a_checkpoint(tmp_path):
    """A run whose iterations are short stops at the next one with a checkpoint, as before."""
    proc = start(*SMALL, "train.total_steps=10000000", "hydra.run.dir=run", cwd=tmp_path)
    wait_for(lambda: (tmp_path / "run" / "checkpoints" / "ckpt_000000000512.pt").exists(), proc)
    err, took = _stopped_within_seconds(proc)
    assert proc.returncode == 128 + signal.SIGINT and took < STOP_GRACE_SECONDS, (took, err)
    assert "with a checkpoint saved" in lines_of(err)[-1]


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


# --------------------------------------------------------------------------- the run dir deleted mid-run
def test_the_run_dir_deleted_mid_run_says_its_checkpoints_went_with_it(tmp_path):
    """A test phase every 128 env steps: its best.pt, written after the deletion, once made the run dir again (with
    only checkpoints/best.pt and eval.jsonl), and the line then said no checkpoint had been saved."""
    proc = start(*SMALL, "train.total_steps=409600", "train.test_every=128", "hydra.run.dir=run", cwd=tmp_path)
    wait_for(lambda: (tmp_path / "run" / "checkpoints" / "latest").exists(), proc)
    for _ in range(50):  # as `rm -rf` run again would (see test_faults.py)
        shutil.rmtree(tmp_path / "run", ignore_errors=True)
        if not (tmp_path / "run").exists():
            break
        time.sleep(0.05)
    _, err = proc.communicate(timeout=120)
    (line,) = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 1 and "cannot write" in line, err
    assert f"the run directory {tmp_path / 'run'} is gone, with every checkpoint it held" in line, line
    assert "no checkpoint was saved" not in line
    assert not (tmp_path / "run").exists()  # not made again by the next test phase's best.pt


@pytest.mark.slow
def test_a_hung_env_without_a_timeout_is_unchanged_by_default(tmp_path):
    """train.step_timeout is off by default: a slow step is not cut short (the yaml default is null)."""
    out = run(RL_TRAIN, "--cfg", "job", cwd=tmp_path)
    assert "step_timeout: null" in out.stdout
    with pytest.raises(subprocess.TimeoutExpired):
        run(RL_TRAIN, *SMALL, *HUNG, "+env.kwargs.at=3", cwd=tmp_path, timeout=4)


def test_a_best_model_is_not_written_into_a_run_dir_that_was_deleted(tmp_path):
    """The test phase's best.pt once made a deleted run dir again (checkpoints/best.pt alone), so the failure's line
    said no checkpoint had been saved: it now fails as the other writes do, and nothing is made."""
    from types import SimpleNamespace

    import torch
    from omegaconf import OmegaConf

    from rlcli.run.state import TrainState, save_best

    components = SimpleNamespace(cfg=OmegaConf.create({"algo": {"name": "ppo"}}),
                                 algo=SimpleNamespace(networks=torch.nn.Linear(2, 1)))
    with pytest.raises(FileNotFoundError):
        save_best(components, TrainState(), tmp_path / "gone")  # type: ignore[arg-type]
    assert not (tmp_path / "gone").exists()
    assert save_best(components, TrainState(), tmp_path).is_file()  # a run dir that is there: written as before


def test_a_callers_own_alarm_is_kept_across_a_run(tmp_path):
    """rlcli holds SIGALRM while a run's deadlines may need it; a caller's pending alarm (signal.alarm, a test
    timeout) is paused, re-armed afterwards for what was left of it, and a sweep's job (no grace) leaves it alone."""
    import signal as signals

    from rlcli.run.stop import STOP_GRACE_SECONDS, StopSignals

    fired: list[int] = []
    previous = signals.signal(signals.SIGALRM, lambda *_: fired.append(1))
    try:
        signals.setitimer(signals.ITIMER_REAL, 100)
        StopSignals(grace=STOP_GRACE_SECONDS).catch()()
        left, _ = signals.getitimer(signals.ITIMER_REAL)
        assert 95 < left <= 100
        signals.setitimer(signals.ITIMER_REAL, 0.05)
        restore = StopSignals(grace=STOP_GRACE_SECONDS).catch()
        time.sleep(0.2)  # due while the run holds the timer
        assert not fired
        restore()
        time.sleep(0.05)
        assert fired == [1]  # late rather than never
        signals.setitimer(signals.ITIMER_REAL, 100)
        StopSignals(grace=None).catch()()
        assert signals.getitimer(signals.ITIMER_REAL)[0] > 95
    finally:
        signals.setitimer(signals.ITIMER_REAL, 0)
        signals.signal(signals.SIGALRM, previous)
