"""collector=ray: the envs step on Ray workers (a private Ray instance on 127.0.0.1, stopped by each test)."""

import os
import signal

import pytest
from conftest import RL_TRAIN, ray_cluster_on_localhost, run_cli
from omegaconf import OmegaConf
from test_resume import CADENCE, QUIET, assert_equal_state, final, run, scalars, start, wait_for_checkpoint

from rlcli.run.compose import compose_config

pytestmark = pytest.mark.slow
# Tests that start Ray: one at a time, also across pytest-xdist workers (conftest.ray_exclusive). The others (a
# setting refused before Ray starts, a config read) do not take the lock: they had waited for another worker's Ray
# test to end, that worker idle meanwhile (77 s for one of them here, 2026-11-28)
starts_ray = pytest.mark.usefixtures("ray_exclusive")

PPO = ["algo=ppo", "env=CartPole-v1", "train.vector_mode=sync", "train.total_steps=4096", *CADENCE, *QUIET]
RAY = ["collector=ray", "collector.workers=2", "collector.envs_per_worker=4"]


@starts_ray
def test_two_workers_of_four_envs_reproduce_eight_local_envs_and_resume_exactly(tmp_path):
    """PPO, deterministic: 2 Ray workers x 4 envs, stopped by SIGTERM at its first checkpoint and resumed,
    give the TensorBoard scalars, networks, optimizer and rollout of an uninterrupted local 8-env run."""
    local = start([*PPO, "train.num_envs=8", f"hydra.run.dir={tmp_path / 'local'}"], tmp_path)
    _, err = local.communicate(timeout=600)
    assert local.returncode == 0, err
    stopped = tmp_path / "ray"
    proc = start([*PPO, *RAY, f"hydra.run.dir={stopped}"], tmp_path)
    wait_for_checkpoint(stopped, proc, timeout=300)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, err
    steps_at_stop = final(stopped)["state"]["env_steps"]
    assert 0 < steps_at_stop < 4096
    resumed = run([f"resume={stopped}"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    log = (stopped / "train.log").read_text()
    assert "collector=ray (2 workers x 4 envs on a private Ray instance, synchronous)" in log
    assert f"resumed at {steps_at_stop:,} env steps" in log
    assert "were reset" not in log  # the workers' envs came back from the checkpoint

    fl, fr = final(tmp_path / "local"), final(stopped)
    assert_equal_state(fl["algo"], fr["algo"], "algo")
    assert_equal_state(fl["buffer"], fr["buffer"], "buffer")
    assert fl["state"]["env_steps"] == fr["state"]["env_steps"] == 4096
    assert fl["state"]["episodes"] == fr["state"]["episodes"]
    sl, sr = scalars(tmp_path / "local"), scalars(stopped)
    ray_only = {tag: series for tag, series in sr.items() if tag.startswith("collector/")}
    assert {tag: series for tag, series in sr.items() if tag not in ray_only} == sl
    assert {v for _, v in ray_only["collector/policy_lag"]} == {0.0}
    assert {v for _, v in ray_only["collector/restarts"]} == {0.0}


MASKED = {
    # a masked algorithm: each worker acts among its rows' valid actions (the others' rows all valid, discarded)
    "masked": ["algo=maskable_ppo", "env=ValidMoves-v0", "algo.n_steps=64", "algo.batch_size=64"],
    # a turn-based env: the rows' turns and masks travel with the fragments, and who acts at the last observations
    "turn-based": ["algo=maskable_ppo", "env=tictactoe", "algo.n_steps=16", "algo.batch_size=32", "algo.n_epochs=2",
                   "actor.hidden_sizes=[16]"],
    # gSDE: the workers draw the local run's exploration matrices, and the learner keeps them as its networks' own
    "gsde": ["algo=ppo", "env=Pendulum-v1", "algo.use_sde=true", "algo.sde_sample_freq=8", "algo.n_steps=64",
             "algo.batch_size=64", "actor.hidden_sizes=[16]"],
    # a recurrent actor: each worker steps its rows' carry, and the learner bootstraps from the workers' last carries
    "gru": ["algo=ppo", "env=CartPole-v1", "actor=gru", "algo.n_steps=32", "algo.batch_size=64",
            "actor.hidden_sizes=[16]"],
    # off-policy sequences (R2D2's DQN), synchronous: each transition stored with the carry it began with
    "dqn-gru": ["algo=dqn", "env=MemoryCue-v0", "actor=gru", "buffer=sequence", "algo.learning_starts=256",
                "algo.batch_size=16", "buffer.seq_len=8", "buffer.burn_in=2", "actor.hidden_sizes=[16]"],
    # Ornstein-Uhlenbeck noise: its per-env state, which acting steps, is the learner's to save
    "td3-ou": ["algo=td3", "env=Pendulum-v1", "algo.noise=ornstein_uhlenbeck", "algo.learning_starts=256",
               "algo.batch_size=32", "algo.train_freq=64", "algo.gradient_steps=4", "actor.hidden_sizes=[16]"],
}


@starts_ray
@pytest.mark.parametrize("case", list(MASKED))
def test_masked_turn_based_and_gsde_runs_on_workers_reproduce_local_ones_and_resume_exactly(case, tmp_path):
    """Ray workers (2 x 4 envs), stopped at the first checkpoint and resumed: the networks (gSDE's matrices too),
    optimizer, rollout (its masks and turns) and scalars of an uninterrupted local 8-env run."""
    args = [*MASKED[case], "train.vector_mode=sync", "train.total_steps=2048", "train.checkpoint_every=256",
            "train.test_every=512", "train.log_every=256", "train.test_episodes=2", "torch_threads=1", *QUIET]
    local = run([*args, "train.num_envs=8", f"hydra.run.dir={tmp_path / 'local'}"], tmp_path)
    assert local.returncode == 0, local.stderr
    stopped = tmp_path / "ray"
    synchronous = ["collector.max_policy_lag=0"] if case in ("dqn-gru", "td3-ou") else []  # (on-policy runs are)
    proc = start([*args, *RAY, *synchronous, f"hydra.run.dir={stopped}"], tmp_path)
    wait_for_checkpoint(stopped, proc, timeout=300)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, err
    resumed = run([f"resume={stopped}"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    log = (stopped / "train.log").read_text()
    assert "collector=ray (2 workers x 4 envs on a private Ray instance, synchronous)" in log
    assert "were reset" not in log
    fl, fr = final(tmp_path / "local"), final(stopped)
    assert_equal_state(fl["algo"], fr["algo"], "algo")
    assert_equal_state(fl["buffer"], fr["buffer"], "buffer")
    assert fl["state"]["env_steps"] == fr["state"]["env_steps"] == 2048
    sl, sr = scalars(tmp_path / "local"), scalars(stopped)
    assert {tag: series for tag, series in sr.items() if not tag.startswith("collector/")} == sl


@starts_ray
def test_workers_on_an_existing_cluster(tmp_path):
    """collector.address: the run joins a running cluster (one node on 127.0.0.1) and leaves it running."""
    import subprocess

    with ray_cluster_on_localhost(num_cpus=2) as (port, env):
        args = ["algo=ppo", "env=CartPole-v1", "train.total_steps=1024", "train.test_every=1024", *QUIET, *RAY,
                f"collector.address=127.0.0.1:{port}", f"hydra.run.dir={tmp_path / 'run'}"]
        out = subprocess.run([str(RL_TRAIN), *args], cwd=tmp_path, capture_output=True, text=True, env=env,
                             timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        log = (tmp_path / "run" / "train.log").read_text()
        assert f"collector=ray (2 workers x 4 envs on 127.0.0.1:{port}, synchronous)" in log
        assert final(tmp_path / "run")["state"]["env_steps"] == 1024
        status = subprocess.run([str(RL_TRAIN.parent / "ray"), "status", f"--address=127.0.0.1:{port}"],
                                capture_output=True, text=True, env=env, timeout=120)
        assert status.returncode == 0, status.stderr  # the cluster outlives the run


def components(*overrides):
    from rlcli.run.build import build

    return build(compose_config(list(overrides)))


@starts_ray
def test_off_policy_collects_ahead_with_bounded_lag_and_survives_a_killed_worker(monkeypatch, tmp_path):
    """DQN with max_policy_lag=1: after the first phase every fragment acted with weights one update old.
    A worker killed with SIGKILL is restarted by Ray and its fragment collected again: no steps are lost."""
    import ray

    monkeypatch.chdir(tmp_path)
    c = components("algo=dqn", "env=CartPole-v1", "collector=ray", "collector.workers=2",
                   "train.num_envs=4", "algo.learning_starts=0", "algo.batch_size=32", "train.vector_mode=sync")
    try:
        per_phase = c.algo.steps_per_collect * 4
        lags = []
        for _ in range(3):
            stats = c.collector.collect(c.learner)
            assert stats.steps == per_phase
            lags.append(stats.scalars["collector/policy_lag"])
            c.algo.update(c.buffer, __import__("conftest").at(0.5))
        assert lags == [0.0, 1.0, 1.0]
        victim = ray.get(c.collector.workers[0].pid.remote())
        c.collector.collect(c.learner)
        os.kill(victim, signal.SIGKILL)  # while it collects the fragment the next phase will ask for
        told = []  # the replay hears that the restarted worker's envs (0 and 1) began new episodes
        monkeypatch.setattr(c.buffer, "envs_reset", told.append)
        stats = c.collector.collect(c.learner)
        assert stats.steps == per_phase and len(stats.episode_returns) > 0
        assert stats.scalars["collector/restarts"] == 1.0
        assert told == [[0, 1]]
        assert ray.get(c.collector.workers[0].pid.remote()) != victim  # a new process
        stats = c.collector.collect(c.learner)  # and it goes on collecting
        assert stats.steps == per_phase
        note = c.collector.restore_envs(c.collector.env_state())
        assert note is not None and "asynchronous" in note  # async resume: the envs are reset, with a warning
    finally:
        c.close()
    assert not ray.is_initialized()
    assert "RAY_AUTH_MODE" not in os.environ  # ray.init's variables are gone with it (a later `ray start` works)
    again = components("algo=ppo", "env=CartPole-v1", "collector=ray")  # a second instance in this process
    try:
        assert again.collector.collect(again.learner).steps == again.algo.steps_per_collect * 8
    finally:
        again.close()


@pytest.mark.parametrize("args, expected", [
    (["collector.workers=3"], "collector.workers=3 does not divide train.num_envs=8; choose from: 1, 2, 4, 8"),
    (["collector.address=127.0.0.1:9"], "collector.address=127.0.0.1:9: no Ray head answers there"),
    (["collector.address=nowhere"], "collector.address='nowhere' is invalid: use HOST:PORT"),
    (["collector.workrs=2"], "unknown key 'collector.workrs'"),
    (["collector.max_policy_lag=-1"], "collector.max_policy_lag=-1 is invalid: must be >= 0"),
    (["algo=sac", "env=Pendulum-v1", "algo.use_sde=true"],
     "collector=ray keeps gSDE's exploration matrices (algo.use_sde=true) in step with the workers in synchronous "
     "mode only: set collector.max_policy_lag=0"),
    # a multi-agent env's rows come in copies of all its agents: each worker's share must be whole copies
    (["algo=ippo", "env=coop_match", "collector.envs_per_worker=3"],
     "collector.envs_per_worker=3: env rlcli.envs.pz_toys:coop_match has 2 agents, one row each, so a worker's envs "
     "must be a multiple of 2"),
    (["algo=ippo", "env=coop_match", "train.num_envs=6"],
     "train.num_envs=6 over collector.workers=2 (3 each): env rlcli.envs.pz_toys:coop_match has 2 agents"),
    # a batch checked against the envs says where their count came from (a typed train.num_envs it overrode)
    (["collector.envs_per_worker=2", "train.num_envs=16", "algo.n_steps=128", "algo.batch_size=1024"],
     "algo.batch_size=1024 is invalid: must be in [1, n_steps * num_envs = 512] (train.num_envs=16 is not used: "
     "collector.envs_per_worker=2 on collector.workers=2 run 4 envs)"),
])
def test_collector_settings_that_cannot_work_are_one_line(tmp_path, args, expected):
    out = run_cli("collector=ray", *args, "train.total_steps=64", cwd=tmp_path, timeout=120)
    assert out.returncode == 2, out.stderr
    assert expected in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_collector_local_has_no_settings(tmp_path):
    out = run_cli("collector.workers=2", "train.total_steps=64", cwd=tmp_path, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == "rl-train: error: unknown key 'collector.workers'; valid keys: name"


def test_old_checkpoints_without_a_collector_choice_still_resume():
    from rlcli.run.resume import incompatible_changes

    saved = OmegaConf.to_container(compose_config(["algo=ppo"]))
    current = dict(saved)
    saved.pop("collector")
    assert incompatible_changes(saved, current) == []
    assert incompatible_changes(dict(current), OmegaConf.to_container(compose_config(["collector=ray"])))


def test_without_ray_installed_the_error_names_the_extra(monkeypatch):
    import sys

    from rlcli.collectors.ray_settings import RaySettings, check_ray
    from rlcli.registry import ConfigError

    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets where Ray is not installed
    with pytest.raises(ConfigError, match=r"collector=ray needs Ray: pip install -e '\.\[ray\]'"):
        check_ray(RaySettings())


@starts_ray
def test_a_sweep_checks_its_jobs_without_starting_ray_and_runs_them_on_workers(monkeypatch, tmp_path):
    """The sweep's pre-check builds every job to check it; with collector=ray it checks the settings but does
    not start Ray and the workers once per job (about 10 s each). Each job then collects on its workers."""
    from rlcli.collectors.ray_collector import RayCollector
    from rlcli.entry.rl_train import precheck_sweep
    from rlcli.run.budget import SAID_BY_SWEEP

    def no_ray(self):
        raise AssertionError("the pre-check started Ray")

    sweep = ["algo=ppo", "env=CartPole-v1", "seed=0,1", "train.num_envs=2", "algo.n_steps=64", "algo.batch_size=64",
             "train.total_steps=256", "train.test_every=256", *QUIET, "collector=ray", "collector.workers=2"]
    with monkeypatch.context() as patch:
        patch.setattr(RayCollector, "_start", no_ray)
        # the pre-check sets it for the sweep's jobs (entry/rl_train.py): gone again with this block, or this pytest
        # worker's later runs (and the rl-train runs it starts) would say no budget warning of their own
        patch.setitem(os.environ, SAID_BY_SWEEP, "")
        precheck_sweep(sweep)
    out = run_cli("-m", *sweep, f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    for job in ("0", "1"):
        log = (tmp_path / "sweep" / job / "train.log").read_text()
        assert "collector=ray (2 workers x 1 envs on a private Ray instance, synchronous)" in log
        assert final(tmp_path / "sweep" / job)["state"]["env_steps"] == 256


@starts_ray
def test_ctrl_c_in_a_terminal_reaches_ray_too_and_the_run_still_saves(tmp_path):
    """A terminal's Ctrl-C goes to the whole foreground process group, Ray's processes included: the learner
    still saves its checkpoint (the workers' env states with it), says so, and nothing of Ray is left."""
    import subprocess
    import time

    run_dir = tmp_path / "run"
    proc = subprocess.Popen([str(RL_TRAIN), *PPO, *RAY, "train.total_steps=10000000", f"hydra.run.dir={run_dir}"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own group, as a terminal gives a foreground job
    wait_for_checkpoint(run_dir, proc, timeout=300)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, err
    saved = final(run_dir)["state"]["env_steps"]
    assert f"SIGINT: stopped at {saved:,} env steps with a checkpoint saved" in (run_dir / "train.log").read_text()
    deadline = time.time() + 30
    while time.time() < deadline:  # Ray's processes in the group end too
        left = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True).stdout.split()
        if not left:
            break
        time.sleep(0.5)
    assert not left
    resumed = run([f"resume={run_dir}", "train.total_steps=" + str(saved + 2048)], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "were reset" not in (run_dir / "train.log").read_text()


def test_a_sigterm_while_ray_starts_reaches_rl_trains_own_handler():
    """ray.init sets its own SIGTERM handler first (sys.exit(15): the process ended with no word); a SIGTERM then is
    answered by rl-train's start-up handler (its one line), and other exits pass through."""
    from rlcli.collectors.ray_collector import _init_keeping_sigterm

    told = []

    def ours(signum, frame):
        told.append(signum)
        raise KeyboardInterrupt

    def ray_stopped_by(code):
        def init():
            raise SystemExit(code)
        return init

    before = signal.signal(signal.SIGTERM, ours)
    try:
        with pytest.raises(KeyboardInterrupt):
            _init_keeping_sigterm(ray_stopped_by(signal.SIGTERM))
        assert told == [signal.SIGTERM]
        with pytest.raises(SystemExit):
            _init_keeping_sigterm(ray_stopped_by(3))
        assert told == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, before)
