"""A new user's first hour (issue: stumbles found trying rlcli as a new user would)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import forked_cli
import gymnasium as gym
import pytest
from conftest import LOSE_A_SIGTERM, REPO, RL_TRAIN, run_cli

from rlcli.envs import missing_dependency


def one_line_error(out: subprocess.CompletedProcess) -> str:
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("rl-train: error: "), out.stderr
    return lines[0]


def test_a_missing_env_package_is_one_line_naming_the_pip_command(tmp_path):
    (tmp_path / "needs_dep.py").write_text(
        "import gymnasium as gym\n\n\nclass NeedsDep(gym.Env):\n    def __init__(self, **kwargs):\n"
        "        raise gym.error.DependencyNotInstalled('foo is not installed, run `pip install foo`')\n\n\n"
        "gym.register('NeedsDep-v0', entry_point=NeedsDep)\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path), HYDRA_FULL_ERROR="0")
    out = forked_cli.run(["env=gym", "env.id=needs_dep:NeedsDep-v0"], tmp_path, timeout=300, env=env)
    line = one_line_error(out)
    assert "NeedsDep-v0 needs a package that is not installed: foo is not installed, run `pip install foo`" in line
    assert not any(tmp_path.rglob("*.log"))  # nothing written
    for env_id, advice in (("LunarLander-v3", "pip install -e '.[box2d]'"),
                           ("HalfCheetah-v5", "pip install -e '.[mujoco]'")):
        assert advice in missing_dependency(gym.spec(env_id), gym.error.DependencyNotInstalled("x"))


def test_sb3_names_point_to_rlcli_keys(cli):
    assert "SB3's learning_rate is algo.lr here" in one_line_error(cli("algo.learning_rate=1e-3"))
    assert "SB3's n_timesteps is train.total_steps here" in one_line_error(cli("n_timesteps=1000"))
    assert "SB3's buffer_size is buffer.capacity here" in one_line_error(cli("algo=sac", "algo.buffer_size=10"))
    line = one_line_error(cli("env=FrozenLake-v1"))
    assert "env=gym env.id=FrozenLake-v1" in line and "did you mean" not in line


@pytest.mark.parametrize(("args", "expected"), [
    (["--algo", "ppo"], "unknown flag '--algo': rl-train takes key=value arguments, e.g. algo=ppo"),
    (["--seed=3"], "unknown flag '--seed=3': rl-train takes key=value arguments, e.g. seed=3"),
    (["-m", "seed=0,1", "--nope"], "unknown flag '--nope': rl-train takes key=value arguments, e.g. nope=<value>"),
    (["algo", "sac"], "'algo' is not a key=value argument: write algo=sac"),
    (["ppo"], "'ppo' is not a key=value argument: write algo=ppo"),
    (["algo=sac", "Pendulum-v1"], "'Pendulum-v1' is not a key=value argument: write env=Pendulum-v1"),
])
def test_argparse_habits_are_one_line_with_the_key_value_form(cli, tmp_path, args, expected):
    assert one_line_error(cli(*args)) == f"rl-train: error: {expected}"
    assert not (tmp_path / "runs").exists() and not (tmp_path / "multirun").exists()


def test_hydra_flags_with_values_still_work(cli):
    out = cli("--cfg", "job", "algo=sac", "-cn", "config")
    assert out.returncode == 0, out.stderr
    assert "name: sac" in out.stdout


@pytest.mark.slow
def test_budget_warnings_and_the_env_id_in_the_run_dir(tmp_path):
    out = run_cli("env=gym", "env.id=Acrobot-v1", "train.total_steps=300", "algo.n_steps=64", "train.num_envs=8",
                  "train.test_every=0", "log.console=false", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert ("train.total_steps=300 is not a whole number of collect phases (one rollout is 64 x 8 envs = 512 "
            "env steps): the run takes 512 env steps") in out.stderr
    run_dirs = list((tmp_path / "runs" / "ppo").iterdir())
    assert [d.parent.name for d in run_dirs] == ["ppo"] and (tmp_path / "runs" / "ppo" / "Acrobot-v1").is_dir()
    assert "512 env steps" in (next((tmp_path / "runs").rglob("train.log"))).read_text()
    out = run_cli("algo=td3", "env=Pendulum-v1", "train.total_steps=1000", "algo.learning_starts=2000",
                  "algo.batch_size=64", "train.test_every=0", "log.console=false", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert ("algo.learning_starts=2,000 > the run's 1,000 env steps: it acts randomly throughout and never learns"
            in out.stderr)
    # at equality the last collect phase's update still runs (the warning said "never learns")
    out = run_cli("algo=td3", "env=Pendulum-v1", "train.total_steps=1000", "algo.learning_starts=1000",
                  "algo.batch_size=64", "algo.gradient_steps=2", "train.test_every=0", "log.console=false",
                  cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert ("algo.learning_starts=1,000 <= the run's 1,000 env steps: it acts randomly throughout and learns only "
            "after its last collect phase") in out.stderr
    out = run_cli("algo=td3", "env=Pendulum-v1", "train.total_steps=1000", "algo.learning_starts=999",
                  "algo.batch_size=64", "algo.gradient_steps=2", "train.test_every=0", "log.console=false",
                  cwd=tmp_path)
    assert out.returncode == 0 and "learning_starts" not in out.stderr, out.stderr


def test_help_names_the_command(cli):
    out = cli("--help")
    assert out.returncode == 0 and out.stdout.startswith("rl-train: train a reinforcement-learning agent")
    assert "powered by Hydra" not in out.stdout.splitlines()[0]


def test_make_train_installs_only_what_training_needs():
    makefile = (REPO / "Makefile").read_text()
    train_target = makefile.split("$(BIN)/rl-train: pyproject.toml", 1)[1].split("\n\n", 1)[0]
    assert "-e ." in train_target and "[dev]" not in train_target
    test_target = makefile.split("\ntest:", 1)[1].split("\n", 1)[0]
    assert ".dev-extras" in test_target


def test_no_run_says_both_stopping_and_budget_reached(tmp_path):
    out = run_cli("env=CartPole-v1", "train.total_steps=64", "algo.n_steps=8", "algo.batch_size=32",
                  "train.test_every=64", "train.test_episodes=1", "train.stop_reward=1", "log.console=false",
                  cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    log = next(Path(tmp_path).rglob("train.log")).read_text()
    assert "budget reached" in log and "stopping at" not in log


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "delay"), [(signal.SIGINT, 0.2), (signal.SIGINT, 1.5), (signal.SIGTERM, 0.2),
                                            (signal.SIGTERM, 1.5)])
def test_a_signal_during_start_up_is_one_line_and_its_exit_code(tmp_path, sig, delay):
    proc = subprocess.Popen([str(RL_TRAIN), "algo=ppo", "env=CartPole-v1", "log.console=false",
                             f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(delay)  # imports (0.2 s), or later in start-up (on a quiet machine training may have begun)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err
    assert "Traceback" not in err, err
    if delay < 1:
        assert "during start-up" in err and len(err.strip().splitlines()) == 1, err
    else:  # either still starting up (one line) or the trainer's own clean stop with a checkpoint
        assert "during start-up" in err or "stopped at" in err, err


LOST_INTERRUPT = LOSE_A_SIGTERM + """
import sys

import rlcli.entry.rl_train as rl_train
from rlcli.entry import cli
from rlcli.run.stop import StopSignals


def start_up():
    lose_a_sigterm()
    print("start-up went on")
    StopSignals().catch()  # the training loop's first step: start-up ends here
    print("training began")


rl_train.main = start_up
sys.argv = ["rl-train"]
cli.train()
"""


def test_a_start_up_signal_whose_interrupt_python_ignored_still_stops_start_up_in_one_line():
    """A SIGTERM that lands where Python ignores exceptions (CI once saw it in importlib's module-lock callback
    during start-up: the KeyboardInterrupt was lost, the run trained to its end and exited 0, with a traceback on
    stderr): start-up ends where the loop would begin, with the start-up line and exit code, nothing trained."""
    out = subprocess.run([sys.executable, "-c", LOST_INTERRUPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 128 + signal.SIGTERM, out.stdout + out.stderr
    assert "start-up went on" in out.stdout and "training began" not in out.stdout, out.stdout
    assert "during start-up" in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_a_run_dir_left_by_start_up_resumes_as_a_fresh_run(tmp_path):
    run_dir = tmp_path / "run"  # what Hydra leaves when a run is stopped before its first checkpoint
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text("- algo=ppo\n- env=CartPole-v1\n- algo.n_steps=16\n")
    (run_dir / "train.log").write_text("")
    out = run_cli(f"resume={run_dir}", "train.total_steps=256", "algo.batch_size=64", "train.test_every=0",
                  "log.console=false", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "no checkpoint yet" in out.stderr and "starting it fresh" in out.stderr
    assert (run_dir / "checkpoints" / "latest").is_file()


def test_tensorboard_gets_a_point_per_on_policy_update(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = run_cli("env=CartPole-v1", "train.total_steps=1024", "algo.n_steps=16", "algo.batch_size=64",
                  "train.test_every=0", "train.log_every=5000", "log.console=false", f"hydra.run.dir={tmp_path}/r",
                  cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    acc = EventAccumulator(str(tmp_path / "r" / "tb"))
    acc.Reload()
    steps = [e.step for e in acc.Scalars("train/policy_loss")]
    assert steps == list(range(128, 1025, 128))  # 16 steps x 8 envs per update; the table is every 5000


def test_piped_console_is_plain_lines_with_rounded_returns(tmp_path):
    out = run_cli("env=Pendulum-v1", "train.total_steps=1024", "algo.n_steps=64", "train.num_envs=4",
                  "train.log_every=512", "train.test_every=1024", "train.test_episodes=2", "log.console=true",
                  cwd=tmp_path)  # captured: not a terminal
    assert out.returncode == 0, out.stderr
    assert out.stderr.strip().splitlines()[0].startswith("rlcli: ppo on Pendulum-v1, 1,024 env steps")
    lines = out.stdout.strip().splitlines()  # the results on stdout, progress and messages on stderr
    assert [line.split(" |")[0] for line in lines if line.startswith("step ")] == ["step 512", "step 1024"]
    assert lines[-2].startswith("done: 1,024 env steps") and lines[-1].startswith("time: ")
    assert not any(ch in out.stderr + out.stdout for ch in "━─│")  # no bar, no table borders
    final = lines[-2].split("last test return ")[1].split(",")[0]
    assert len(final.split(".")[-1]) == 1  # one decimal, not 16 digits
