"""Sweeps: multirun with the basic, joblib and Ray launchers, the Optuna sweeper, resume=auto."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import forked_cli
import pytest
import yaml
from conftest import RL_TRAIN, ray_cluster_on_localhost
from test_population import (
    _wait_until_gone,
    _wait_until_saved,
    _worker_pids,
    finish,
    kill_a_worker_then_expect_one_line,
)
from test_resume import assert_equal_state, final

PLUGINS = str(Path(__file__).parent / "plugins")
TINY = ["train.total_steps=1000", "train.test_every=500", "train.test_episodes=2", "train.num_envs=2",
        "algo.n_steps=64", "algo.batch_size=64", "log.tensorboard=false"]


def statuses(sweep_dir: Path) -> dict[int, dict]:
    return {int(p.parent.name): json.loads(p.read_text()) for p in sweep_dir.glob("*/status.json")}


@pytest.mark.slow
def test_basic_multirun_keeps_going_past_a_failed_job(cli, tmp_path):
    """Job 1 crashes mid-run: job 0 still completes, the summary names the failure, exit code 1."""
    env = dict(os.environ, PYTHONPATH=PLUGINS, HYDRA_FULL_ERROR="0")
    out = forked_cli.run(
        ["-m", "env=gym", "env.id=odd_envs:CrashAfter-v0", "+env.kwargs.crash_after=100000,30",
         "train.vector_mode=sync", *TINY, "hydra.sweep.dir=sw"], tmp_path, timeout=300, env=env)
    assert out.returncode == 1, out.stderr[-2000:]
    jobs = statuses(tmp_path / "sw")
    assert jobs[0]["status"] == "completed" and jobs[0]["env_steps"] >= 1000
    assert jobs[1]["status"] == "failed" and "simulated crash after 30 steps" in jobs[1]["error"]
    assert (tmp_path / "sw" / "1" / "error.txt").is_file()
    assert "1 of 2 jobs did not complete" in out.stderr
    for job in (0, 1):  # every job has its own Hydra record
        assert (tmp_path / "sw" / str(job) / ".hydra" / "overrides.yaml").is_file()
    # job 1 runs in job 0's process: its start-up is counted from its own start, not the process's
    startup = [line for line in (tmp_path / "sw" / "1" / "train.log").read_text().splitlines() if "start-up" in line]
    assert len(startup) == 1 and "after the job started" in startup[0], startup
    assert float(startup[0].split("comes ")[1].split(" s")[0]) < 60


@pytest.mark.slow
def test_joblib_sweep_in_parallel_then_rl_report_plots_it(cli, tmp_path):
    out = cli("-m", "seed=0,1", *TINY, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "hydra.sweep.dir=jl")
    assert out.returncode == 0, out.stderr[-2000:]
    jobs = statuses(tmp_path / "jl")
    assert [jobs[i]["status"] for i in (0, 1)] == ["completed", "completed"]
    assert (tmp_path / "jl" / "0" / "checkpoints" / "latest").is_file()
    assert "seed=1" in out.stderr and "completed" in out.stderr  # the summary table

    report = forked_cli.run(["jl", "--plot", "curves.png", "--csv", "t.csv"], tmp_path, timeout=120,
                            program="rl-report")
    assert report.returncode == 0, report.stderr
    assert "2: 0,1" in report.stdout  # one configuration, two seeds
    import matplotlib.image

    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(tmp_path / "curves.png")
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_a_swept_null_is_checked_as_null():
    """`train.stop_reward=null,500`: the pre-check tried the value 'None' (refused, naming null as valid)."""
    from rlcli.sweeps.jobs import probe_combinations

    assert probe_combinations(["train.stop_reward=null,500", "seed=range(0,2)"]) == [
        ["train.stop_reward=null", "seed=0"], ["train.stop_reward=null", "seed=1"],
        ["train.stop_reward=500", "seed=0"], ["train.stop_reward=500", "seed=1"]]
    assert probe_combinations(["algo.lr=choice(1e-3,3e-4)"]) == [["algo.lr=0.001"], ["algo.lr=0.0003"]]


@pytest.mark.parametrize(("args", "expected"), [
    (["train.num_envs=8,0"], "train.num_envs=0 is invalid: must be in [1, 65536]"),
    (["algo=ppo,dqnn"], "unknown algo 'dqnn'"),
    (["algo.lrr=1e-3,1e-4"], "unknown key 'algo.lrr'"),
    (["hydra/launcher=submitit_local", "seed=0,1"], "pip install hydra-submitit-launcher"),
    (["hydra/sweeper=optuna", "seed=0,1"], "hydra/sweeper=rlcli_optuna"),
    (["resume=auto", "seed=0,1"], "needs hydra.sweep.dir"),
    (["resume=runs/x", "seed=0,1"], "cannot apply to a sweep"),
    (["hparams_search=ppo_cartpole", "algo.n_epochs=0,4"], "algo.n_epochs=0 is invalid"),
    (["hparams_search=ppo_cartpole", "algo.n_epochs=choice(4,-1)"], "algo.n_epochs=-1 is invalid"),
    (["hparams_search=ppo_cartpole", "algo.clip_range=interval(0.1,-0.3)"], "the interval is empty"),
    (["hparams_search=ppo_cartpole", "algo.clip_range=interval(-0.3,0.1)"], "algo.clip_range=-0.3 is invalid"),
    (["algo.lr=interval(oops"], "cannot parse 'algo.lr=interval(oops'"),
    # Hydra's own reason, not only "Error parsing override" again
    (["train.stop_reward=choice(null,500)"], "cannot parse 'train.stop_reward=choice(null,500)': TypeError while "
                                             "evaluating 'choice(null,500)'"),
    # jobs that differ only in a valid seed are built once to check them; a bad seed is still built and named
    (["seed=0,1,4294967296"], "seed=4294967296 is invalid: must be between 0 and 2**32 - 1"),
    (["seed=0,1,x"], "seed='x' is invalid: must be an integer"),
])
def test_bad_sweep_fails_before_any_job(cli, tmp_path, args, expected):
    out = cli("-m", *args, *([] if "resume=auto" in args else ["hydra.sweep.dir=sw"]))
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], out.stderr
    assert not (tmp_path / "sw").exists()


def test_resume_auto_with_another_command_is_one_line_and_leaves_the_sweep_as_it_was(tmp_path):
    """resume=auto finishes a sweep with the command that started it: another algorithm (or values that renumber the
    jobs) would have Hydra rewrite each job's saved config and skip completed jobs under the new command's name, so
    it is refused before anything is written; a changed budget is a resume's to take."""
    args = ["-m", "algo=vdn", "env=coop_match", "seed=0,1", "train.total_steps=200", "train.test_every=200",
            "train.test_episodes=2", "log.tensorboard=false", "log.console=false", f"hydra.sweep.dir={tmp_path / 'sw'}"]
    assert forked_cli.run(args, tmp_path).returncode == 0
    saved = {p: p.read_bytes() for p in (tmp_path / "sw").rglob("*") if p.is_file()}
    for changed, job in ((["algo=qmix"], "0"), (["seed=1,0"], "0")):
        other = [a for a in args if not a.startswith(("algo=", "seed="))] + changed + \
            (["seed=0,1"] if changed[0].startswith("algo=") else ["algo=vdn"])
        out = forked_cli.run([*other, "resume=auto"], tmp_path)
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert out.returncode != 0 and len(lines) == 1, out.stderr[-2000:]
        assert lines[0].startswith(f"rl-train: error: resume=auto: job {job} of ") and "finish a sweep with the " \
            "command that started it plus resume=auto" in lines[0], lines[0]
        assert {p: p.read_bytes() for p in (tmp_path / "sw").rglob("*") if p.is_file()} == saved
    longer = forked_cli.run([*[a for a in args if not a.startswith("train.total_steps")], "train.total_steps=400",
                             "resume=auto"], tmp_path)
    assert longer.returncode == 0 and "already completed, skipped (at " in longer.stderr, longer.stderr[-2000:]
    assert f"a longer train.total_steps does not reopen a finished job: rl-train resume={tmp_path / 'sw'}" in \
        longer.stderr and "train.total_steps=400 trains it on)" in longer.stderr


@pytest.mark.slow
def test_killed_sweep_is_finished_with_resume_auto(tmp_path):
    args = [str(RL_TRAIN), "-m", "seed=0,1,2", "algo.n_steps=16", "algo.batch_size=32", "algo.n_epochs=2",
            "train.num_envs=2", "train.total_steps=6000", "train.checkpoint_every=300", "train.test_every=3000",
            "train.test_episodes=2", "train.stop_reward=null", "log.tensorboard=false", "hydra.sweep.dir=sw"]
    # the basic launcher's sweeps are forked (tests/forked_cli.py) also where signalled or killed; the joblib
    # launchers below stay fresh processes (forked, a killed one's loky resource tracker warned after its last line)
    proc = forked_cli.start(args[1:], tmp_path)
    deadline = time.time() + 120
    while not (tmp_path / "sw" / "1" / "checkpoints" / "latest").is_file():
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = statuses(tmp_path / "sw")
    assert before[0]["status"] == "completed" and before[1]["status"] == "running" and 2 not in before
    ended_0 = before[0]["ended"]
    out = finish([*args, "resume=auto"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "[job 0]" in out.stderr and "already completed, skipped" in out.stderr
    assert "[job 1]" in out.stderr and "resuming from ckpt_" in out.stderr
    after = statuses(tmp_path / "sw")
    assert after[0]["ended"] == ended_0  # not run again
    assert all(after[i]["status"] == "completed" and after[i]["env_steps"] >= 6000 for i in (0, 1, 2))


@pytest.mark.slow
def test_sigterm_to_a_basic_sweep_names_resume_auto_which_finishes_every_job(tmp_path):
    """The basic launcher runs jobs one after another: a SIGTERM stops job 0 with its checkpoint and job 1 never
    starts. The job's line names the sweep's resume (before, only `rl-train resume=<job 0's dir>`, which finishes
    job 0 and never runs job 1), with the sweep's own directory where a nested hydra.sweep.subdir puts the jobs
    deeper (it named the job's parent)."""
    args = [str(RL_TRAIN), "-m", "seed=0,1", "algo.n_steps=16", "algo.batch_size=32", "algo.n_epochs=2",
            "train.num_envs=2", "train.total_steps=6000", "train.checkpoint_every=300", "train.test_every=3000",
            "train.test_episodes=2", "train.stop_reward=null", "log.tensorboard=false", "hydra.sweep.dir=sw",
            "hydra.sweep.subdir=jobs/${hydra.job.num}"]
    jobs_dir = tmp_path / "sw" / "jobs"
    proc = forked_cli.start(args[1:], tmp_path)
    _wait_until_saved(proc, jobs_dir, "0")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    line = next(line for line in err.splitlines() if "SIGTERM: stopped at" in line)
    assert f"hydra.sweep.dir={tmp_path / 'sw'} resume=auto" in line, line
    assert f"this job alone: rl-train resume={jobs_dir / '0'}" in line, line
    assert statuses(jobs_dir)[0]["status"] == "interrupted" and not (jobs_dir / "1").exists()
    # job 0 alone, as its line offers: its record then says it completed, and the sweep's resume skips it (it resumed
    # it and heard "this run already finished")
    alone = forked_cli.run([f"resume={jobs_dir / '0'}", "log.console=false"], tmp_path)
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert statuses(jobs_dir)[0]["status"] == "completed" and statuses(jobs_dir)[0]["env_steps"] >= 6000
    resumed = finish([*args, "resume=auto"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "already completed, skipped" in resumed.stderr and "already finished" not in resumed.stderr
    jobs = statuses(jobs_dir)
    assert all(jobs[i]["status"] == "completed" and jobs[i]["env_steps"] >= 6000 for i in (0, 1)), jobs


# 4,096 steps a job (8,192 before; the three tests that use these jobs took 214 s in CI): the signal still comes
# after the first checkpoint (256) and long before a job ends, a test phase still falls in the resumed part (2,048),
# and resume=auto trains half as much to finish them
JOBLIB_STEPS = 4096
JOBLIB_JOBS = ["algo.n_steps=16", "algo.batch_size=32", "algo.n_epochs=2", "train.num_envs=2",
               f"train.total_steps={JOBLIB_STEPS}",
               "train.checkpoint_every=256", "train.test_every=2048", "train.test_episodes=2", "train.stop_reward=null",
               "log.tensorboard=false", "log.console=false", "deterministic=true", "hydra/launcher=joblib",
               "hydra.launcher.n_jobs=2"]


@pytest.mark.slow
def test_sigterm_stops_a_joblib_sweep_with_checkpoints_and_resume_auto_finishes_it_exactly(tmp_path):
    """hydra/launcher=joblib, 3 jobs on 2 workers: a SIGTERM to rl-train goes on to the workers. The two running jobs
    stop at their next safe point with a checkpoint and `interrupted` records, the third does not start, and rl-train
    says how to finish (before: joblib killed the workers, every record said "running", no checkpoint since the last
    periodic one, and the line was "nothing was trained"). resume=auto then ends job 0 where an uninterrupted run
    ends, bit for bit."""
    args = [str(RL_TRAIN), "-m", "seed=0,1,2", *JOBLIB_JOBS, "hydra.sweep.dir=sw"]
    proc = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_until_saved(proc, tmp_path / "sw", "01")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("rl-train:") and "warning" not in line]
    assert "during start-up" not in err and "Traceback" not in err, err[-3000:]
    assert sum("SIGTERM: stopped at" in line for line in lines) == 2, lines
    assert lines[-1].startswith("rl-train: SIGTERM: the sweep stopped") and "resume=auto" in lines[-1], lines
    jobs = statuses(tmp_path / "sw")
    for job in (0, 1):
        assert jobs[job]["status"] == "interrupted", jobs[job]
        assert 0 < final(tmp_path / "sw" / str(job))["state"]["env_steps"] < JOBLIB_STEPS
    assert jobs[2]["status"] == "interrupted" and "not started" in jobs[2]["error"], jobs[2]
    assert not (tmp_path / "sw" / "2" / "checkpoints").exists()

    resumed = finish([*args, "resume=auto"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    jobs = statuses(tmp_path / "sw")
    assert all(jobs[i]["status"] == "completed" and jobs[i]["env_steps"] == JOBLIB_STEPS for i in (0, 1, 2)), jobs
    straight = finish([str(RL_TRAIN), "-m", "seed=0", *JOBLIB_JOBS, "hydra.sweep.dir=straight"], tmp_path)
    assert straight.returncode == 0, straight.stderr[-3000:]
    assert_equal_state(final(tmp_path / "straight" / "0")["algo"], final(tmp_path / "sw" / "0")["algo"],
                       "algo")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the worker processes through /proc")
def test_a_killed_joblib_worker_is_one_line_and_a_killed_launcher_stops_its_workers(tmp_path):
    """kill -9 on a joblib worker (the out-of-memory killer): one line naming resume=auto, exit 1 (it was joblib's
    TerminatedWorkerError traceback). kill -9 on rl-train: its workers stop within seconds with their checkpoints
    (records `interrupted`) and exit, releasing their jobs' run locks. resume=auto finishes both sweeps."""
    args = [str(RL_TRAIN), "-m", "seed=0,1", *JOBLIB_JOBS]
    proc = subprocess.Popen([*args, "hydra.sweep.dir=a"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    _wait_until_saved(proc, tmp_path / "a", "01")
    kill_a_worker_then_expect_one_line(proc, "job")

    proc = subprocess.Popen([*args, "hydra.sweep.dir=b"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _wait_until_saved(proc, tmp_path / "b", "01")
    workers = _worker_pids(proc.pid)
    assert len(workers) == 2, workers
    proc.kill()
    proc.wait(timeout=30)
    _wait_until_gone(workers)
    assert [r["status"] for r in statuses(tmp_path / "b").values()] == ["interrupted"] * 2
    for sweep in "ab":
        resumed = finish([*args, f"hydra.sweep.dir={sweep}", "resume=auto"], tmp_path)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        jobs = statuses(tmp_path / sweep)
        assert all(jobs[i]["status"] == "completed" and jobs[i]["env_steps"] == JOBLIB_STEPS for i in (0, 1)), jobs


@pytest.mark.slow
def test_optuna_sweeper_runs_trials_over_seeds(cli, tmp_path):
    out = cli("-m", "hparams_search=ppo_cartpole", "hydra.sweeper.n_trials=3", "hydra.sweeper.seed=0",
              "sweep.seeds=[0,1]", "sweep.objective=iqm", "train.total_steps=1024", "train.test_every=512",
              "train.test_episodes=2", "log.tensorboard=false", "hydra.sweep.dir=op")
    assert out.returncode == 0, out.stderr[-2000:]
    result = yaml.safe_load((tmp_path / "op" / "optimization_results.yaml").read_text())
    assert sum(result["trials"].values()) == 3 and result["seeds"] == [0, 1]
    assert set(result["best_params"]) == {"algo.lr", "algo.n_steps", "algo.n_epochs", "algo.gae_lambda",
                                          "algo.ent_coef"}
    jobs = statuses(tmp_path / "op")
    assert sorted(jobs) == [0, 1, 2, 3, 4, 5]  # trial t, seed i -> job 2t + i
    for num, record in jobs.items():
        assert f"seed={num % 2}" in record["overrides"]
    # the best value is the IQM (here: the mean of 2) of the best trial's two final test returns
    best = result["best_trial"]
    finals = [jobs[2 * best + i]["final_test_return"] for i in (0, 1)]
    assert result["best_value"] == pytest.approx(sum(finals) / 2)


@pytest.mark.slow
@pytest.mark.usefixtures("ray_exclusive")  # its `ray stop --force` would stop another test's Ray
def test_ray_cluster_on_localhost_runs_a_sweep_and_stops_it_on_sigterm(tmp_path):
    """A one-node Ray cluster on 127.0.0.1 (loopback only), a 2-job sweep on it, a 3-job sweep stopped by SIGTERM
    and finished with resume=auto, then `ray stop`."""
    with ray_cluster_on_localhost() as (port, env):
        out = subprocess.run(
            [str(RL_TRAIN), "-m", "seed=0,1", *TINY, "hydra/launcher=ray_cluster",
             f"hydra.launcher.ray.init.address=127.0.0.1:{port}",
             f"hydra.sweep.dir={tmp_path / 'ry'}"],  # absolute: Ray workers have their own working dir
            cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        assert f"Connecting to existing Ray cluster at address: 127.0.0.1:{port}" in out.stderr
        jobs = statuses(tmp_path / "ry")
        assert [jobs[i]["status"] for i in (0, 1)] == ["completed", "completed"]

        # SIGTERM to rl-train: 3 jobs on 2 CPUs, the third waiting. rl-train cancels the tasks, which the running jobs
        # take as a Ctrl-C (a checkpoint at their next safe point, records `interrupted`); the waiting one never
        # starts. (rl-train died of the signal before, and Ray then killed its tasks: no checkpoint since the last
        # periodic one, records `running`.) resume=auto finishes all three.
        ray_jobs = [str(RL_TRAIN), "-m", "seed=0,1,2", *[a for a in JOBLIB_JOBS if "hydra.launcher" not in a],
                    "hydra/launcher=ray_cluster", f"hydra.launcher.ray.init.address=127.0.0.1:{port}",
                    f"hydra.sweep.dir={tmp_path / 'stopped'}"]
        proc = subprocess.Popen(ray_jobs, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env)
        # JOBLIB_STEPS, not fewer: job 0 starts first, and when job 1 had its first checkpoint job 0 was at 1,856 env
        # steps (measured here 2026-11-28): at 2,048 it could end before the signal
        _wait_until_saved(proc, tmp_path / "stopped", "01")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
        assert "Traceback" not in err and "rl-train: SIGTERM: the sweep stopped" in err, err[-3000:]
        jobs = statuses(tmp_path / "stopped")
        assert sorted(jobs) == [0, 1] and all(jobs[i]["status"] == "interrupted" for i in (0, 1)), jobs
        assert all(0 < final(tmp_path / "stopped" / str(i))["state"]["env_steps"] < JOBLIB_STEPS for i in (0, 1))
        resumed = subprocess.run([*ray_jobs, "resume=auto"], cwd=tmp_path, capture_output=True, text=True,
                                 env=env, timeout=600)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        jobs = statuses(tmp_path / "stopped")
        assert all(jobs[i]["status"] == "completed" and jobs[i]["env_steps"] == JOBLIB_STEPS for i in (0, 1, 2)), jobs


def test_a_signal_while_a_sweeps_job_starts_says_how_to_finish_the_sweep(monkeypatch):
    """A Ctrl-C landing while a basic sweep's next job was starting (its earlier jobs trained) said "nothing was
    trained ... resume=<it>": the sweep's line names hydra.sweep.dir and resume=auto; a single run keeps its own."""
    from hydra.core.hydra_config import HydraConfig

    from rlcli.run.stop import stopped_during_start_up, sweep_being_run

    monkeypatch.setattr(HydraConfig, "initialized", staticmethod(lambda: False))
    assert sweep_being_run(["algo=ppo", "hydra.sweep.dir=sw"]) is None  # not -m
    assert sweep_being_run(["-m", "seed=0,1", "hydra.sweep.dir=sw"]) == "sw"
    assert sweep_being_run(["--multirun", "seed=0,1"]) == "<the sweep's directory>"
    assert stopped_during_start_up(signal.SIGINT, "sw") == (
        "rl-train: SIGINT while a sweep's job was starting: stopped; finish the sweep with the same command plus "
        "hydra.sweep.dir=sw resume=auto (its finished jobs are skipped)")
    assert "nothing was trained" in stopped_during_start_up(signal.SIGINT)


def test_an_unparsable_sweep_names_the_override_and_advises_quoting_only_for_the_grammar():
    """Each override parsing alone but a sweep function failing (range's step 0) gave quoting advice, which would
    have turned the sweep into a string; a grammar error names its override and says to check brackets and quotes."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from rlcli.run.compose import unparsable

    def reason(args):
        try:
            OverridesParser.create().parse_overrides(args)
            for override in OverridesParser.create().parse_overrides(args):
                list(override.sweep_string_iterator())
        except Exception as error:  # noqa: BLE001  (whatever Hydra raises, as rl-train catches it)
            return unparsable(error, args)
        raise AssertionError("parsed")

    line = reason(["seed=range(1,3,0)", "train.total_steps=64"])
    assert line.startswith("cannot parse 'seed=range(1,3,0) train.total_steps=64': ") and "quoted" not in line, line
    line = reason(["seed=[1", "train.total_steps=64"])
    assert line.startswith("cannot parse 'seed=[1': no viable alternative at input '[1'; check its brackets and "
                           "quotes"), line
