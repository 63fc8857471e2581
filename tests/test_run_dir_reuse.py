"""A new run or sweep pointed at a directory that holds a trained one is refused in one line (Hydra would reuse the
directory as it is: the new run replaced the old one's best model, eval.jsonl and latest checkpoint), and the
directory is left byte for byte as it was; resume=auto still continues it."""

import hashlib
from pathlib import Path

import pytest
from conftest import run_cli

RUN = ["algo=ppo", "env=CartPole-v1", "train.total_steps=256", "algo.n_steps=32", "train.test_every=256",
       "train.num_envs=8", "log.tensorboard=false"]


def digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".rlcli.lock"}  # (the lock names its holder)


def one_line(out) -> str:
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("rl-train: error: "), out.stderr
    return lines[0]


@pytest.mark.slow
def test_a_fresh_run_in_a_trained_run_dir_is_one_line_and_changes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    assert run_cli(*RUN, f"hydra.run.dir={run_dir}", cwd=tmp_path).returncode == 0
    before = digest(run_dir)
    line = one_line(run_cli(*RUN, "seed=3", f"hydra.run.dir={run_dir}", cwd=tmp_path))
    assert f"hydra.run.dir={run_dir} already holds a trained run (checkpoints/ckpt_000000000256.pt): resume=auto" \
        in line and "choose another hydra.run.dir" in line
    assert one_line(run_cli(*RUN, "resume=null", f"hydra.run.dir={run_dir}", cwd=tmp_path)) == line
    assert digest(run_dir) == before
    # resume=auto still goes on from it: a longer budget trains on in the same directory
    longer = run_cli(*RUN[:2], "train.total_steps=512", "resume=auto", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert longer.returncode == 0 and "resumed at 256 env steps" in longer.stderr + longer.stdout, longer.stderr
    # a directory whose run stopped before its first checkpoint (only .hydra) still starts
    started = tmp_path / "started"
    (started / ".hydra").mkdir(parents=True)
    assert run_cli(*RUN, f"hydra.run.dir={started}", cwd=tmp_path).returncode == 0


@pytest.mark.slow
def test_a_new_sweep_in_a_trained_sweep_dir_is_one_line_and_changes_nothing(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", *RUN, "seed=0,1", f"hydra.sweep.dir={sweep}"]
    assert run_cli(*args, cwd=tmp_path).returncode == 0
    before = digest(sweep)
    line = one_line(run_cli(*args, cwd=tmp_path))
    assert f"hydra.sweep.dir={sweep} already holds a sweep's trained jobs (0, 1): resume=auto with the command " \
           "that started it finishes it" in line
    assert digest(sweep) == before
    finished = run_cli(*args, "resume=auto", cwd=tmp_path)
    assert finished.returncode == 0 and "already completed, skipped" in finished.stderr + finished.stdout


@pytest.mark.slow
def test_a_stopped_run_resumed_with_a_budget_it_has_passed_trains_nothing_and_changes_nothing(tmp_path):
    """A run stopped (SIGTERM) at N env steps, resumed with train.total_steps <= N: one line, exit 0, the directory
    as it was (it finished the run at the lower budget: rewrote its .hydra, its last checkpoint and tb, and marked
    it finished); without the lower budget it then trains on to its own."""
    import signal

    import forked_cli
    from test_resume import final, wait_for_checkpoint

    run_dir = tmp_path / "run"
    args = ["algo=ppo", "env=CartPole-v1", "train.total_steps=200000", "algo.n_steps=32", "train.num_envs=8",
            "train.checkpoint_every=256", "train.test_every=0", "train.stop_reward=null", "log.console=false",
            f"hydra.run.dir={run_dir}"]
    proc = forked_cli.start(args, tmp_path)
    wait_for_checkpoint(run_dir, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    steps = final(run_dir)["state"]["env_steps"]
    before = digest(run_dir)
    out = run_cli(f"resume={run_dir}", f"train.total_steps={steps // 2}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert [line for line in out.stderr.splitlines() if line.strip()] == [
        f"rl-train: this run stopped at {steps:,} env steps (test return -), and train.total_steps={steps // 2:,} is "
        f"below that: nothing to train (nothing was changed); resume without train.total_steps to finish its own "
        f"budget, train.total_steps={steps} to finish it where it is, or train.total_steps above {steps:,}"]
    assert digest(run_dir) == before
    out = run_cli(f"resume={run_dir}", f"train.total_steps={steps + 256}", cwd=tmp_path)
    assert out.returncode == 0 and final(run_dir)["state"]["env_steps"] == steps + 256, out.stderr


@pytest.mark.slow
def test_a_run_dir_and_a_sweep_dir_are_not_taken_for_each_other(tmp_path):
    """A run in a sweep's directory, a sweep in a run's, and resume=auto without the sweep's own hydra.sweep.subdir
    (it trained every job again beside the old ones, and rl-report counted each seed twice): one line each, nothing
    written."""
    run_dir, sweep = tmp_path / "run", tmp_path / "sweep"
    assert run_cli(*RUN, f"hydra.run.dir={run_dir}", cwd=tmp_path).returncode == 0
    nested = ["-m", *RUN, "seed=0,1", f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=seed${seed}/job${hydra.job.num}"]
    assert run_cli(*nested, cwd=tmp_path).returncode == 0
    before = digest(tmp_path)
    assert f"hydra.run.dir={sweep} is a sweep's directory (multirun.yaml): a run of its own needs another " \
        "hydra.run.dir" in one_line(run_cli(*RUN, f"hydra.run.dir={sweep}", cwd=tmp_path))
    assert f"hydra.sweep.dir={run_dir} is a trained run's directory (checkpoints/), not a sweep's" in \
        one_line(run_cli("-m", *RUN, "seed=0,1", f"hydra.sweep.dir={run_dir}", cwd=tmp_path))
    assert f"resume=auto: {sweep}'s trained jobs are at seed0/job0, seed1/job1, where this command's jobs " \
        "(hydra.sweep.subdir: their numbers) would not look: give the hydra.sweep.subdir that started the sweep" in \
        one_line(run_cli("-m", *RUN, "seed=0,1", f"hydra.sweep.dir={sweep}", "resume=auto", cwd=tmp_path))
    assert digest(tmp_path) == before
    finished = run_cli(*nested, "resume=auto", cwd=tmp_path)  # with its subdir: the jobs are found, and skipped
    assert finished.returncode == 0 and finished.stdout.count("completed") + finished.stderr.count("completed") >= 2


def _fake_run(path: Path, checkpoint: str = "ckpt_000000000256.pt") -> None:
    (path / "checkpoints").mkdir(parents=True)
    (path / "checkpoints" / checkpoint).write_bytes(b"x")


def test_what_counts_as_a_trained_run_or_sweep_directory(tmp_path):
    """The checks' own rules on made-up trees (no training): a run's checkpoint or best model, a sweep's
    multirun.yaml; other runs deeper down in an unrelated folder (hydra.sweep.dir=., a results folder) do not count,
    and resume=auto may finish fewer jobs than the sweep has."""
    from rlcli.entry.rl_train import check_sweep_dir
    from rlcli.registry import ConfigError
    from rlcli.run.resume import check_not_a_run

    _fake_run(tmp_path / "best_only", "best.pt")
    with pytest.raises(ConfigError, match="holds a run's best model .checkpoints/best.pt. but no checkpoint to resume"):
        check_not_a_run(tmp_path / "best_only", "best_only")
    folder = tmp_path / "experiments"
    _fake_run(folder / "cartpole" / "2026-11-29")  # runs kept deeper down: not this run's files
    check_not_a_run(folder, "experiments")
    check_sweep_dir(folder, "experiments", auto=False, numbered=True, job_args=None)  # its jobs write 0, 1, ...
    _fake_run(folder / "0")
    with pytest.raises(ConfigError, match=r"already holds a sweep's trained jobs \(0\)"):
        check_sweep_dir(folder, "experiments", auto=False, numbered=True, job_args=None)
    sweep = tmp_path / "sweep"
    for job in range(4):
        _fake_run(sweep / str(job))
    (sweep / "multirun.yaml").write_text("{}\n")
    with pytest.raises(ConfigError, match=r"\(0, 1, 2, 3\): resume=auto"):
        check_sweep_dir(sweep, "sweep", auto=False, numbered=True, job_args=None)
    check_sweep_dir(sweep, "sweep", auto=True, numbered=True, job_args=["seed=0,1"])  # fewer jobs: finishes those


def test_a_run_stopped_at_its_own_budget_finishes_unless_the_resume_lowers_it():
    """A run killed after its last checkpoint, at its own budget (a preempted job, re-queued with the same command
    and its budget typed), finishes; one resumed with a budget below its own, that it has passed, trains nothing."""
    from types import SimpleNamespace

    from rlcli.run.resume import RESUMED_BUDGET, budget_passed

    stopped = SimpleNamespace(env_steps=1000, finished=False)
    try:
        RESUMED_BUDGET.update(total_steps=1000)
        assert not budget_passed(stopped, 1000)  # its own budget, typed again: it finishes
        assert not budget_passed(stopped, 1200)
        RESUMED_BUDGET.update(total_steps=990)  # its budget rounded up to whole collect phases: 1,000 taken
        assert not budget_passed(stopped, 990)
        RESUMED_BUDGET.update(total_steps=5000)  # stopped at 1,000 of 5,000
        assert budget_passed(stopped, 800) and budget_passed(stopped, 1000 - 1)
        assert not budget_passed(stopped, 1000)  # exactly the steps taken: it finishes where it is
        RESUMED_BUDGET.clear()  # (its saved config unread: as before, it finishes)
        assert not budget_passed(stopped, 800)
        assert budget_passed(SimpleNamespace(env_steps=1000, finished=True), 1000)
        assert not budget_passed(SimpleNamespace(env_steps=0, finished=False), 0)
    finally:
        RESUMED_BUDGET.clear()


def test_a_sweep_resumed_with_a_budget_its_stopped_job_has_passed_is_one_line(tmp_path):
    """resume=auto with a typed train.total_steps below a stopped job's steps and its own budget: one line before
    any job runs (it finished the job at the lower budget), as a single run's resume says; a finished job, a budget
    at or above the steps, or the job's own budget let the sweep go on."""
    import json

    from rlcli.entry.rl_train import check_same_jobs
    from rlcli.registry import ConfigError

    sweep = tmp_path / "sweep"
    for job, status in ((0, "completed"), (1, "interrupted")):
        _fake_run(sweep / str(job), "ckpt_000000000512.pt")
        (sweep / str(job) / ".hydra").mkdir()
        (sweep / str(job) / ".hydra" / "config.yaml").write_text("train:\n  total_steps: 1024\n")
        (sweep / str(job) / "status.json").write_text(json.dumps(
            {"job": job, "status": status, "overrides": [f"seed={job}", "train.total_steps=1024"]}))
    with pytest.raises(ConfigError, match=rf"resume=auto: job 1 of {sweep} stopped at 512 env steps, and "
                       r"train.total_steps=256 is below that and below its own 1,024: nothing was run; finish the "
                       rf"sweep without the lower train.total_steps .* resume={sweep}/1 train.total_steps=512"):
        check_same_jobs(sweep, ["seed=0,1", "train.total_steps=256"])
    for fine in ("512", "1024", "2048"):
        check_same_jobs(sweep, ["seed=0,1", f"train.total_steps={fine}"])
    check_same_jobs(sweep, ["seed=0,1"])


def test_resuming_a_run_still_starting_in_another_process_says_only_that(tmp_path):
    """A run dir with no checkpoint yet whose rl-train is alive: 'in use by another rl-train', without first warning
    that it starts the run fresh (it said both)."""
    import yaml

    from rlcli.run import lock

    run_dir = tmp_path / "starting"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(RUN))
    lock.acquire(run_dir)  # this process plays the other rl-train
    try:
        out = run_cli(f"resume={run_dir}", cwd=tmp_path)
    finally:
        lock.release(run_dir)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1 and "is in use by another rl-train" in lines[0], out.stderr
