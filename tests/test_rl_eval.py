"""The best model and rl-eval: measure a trained agent as training tested it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import forked_cli
import pytest
from conftest import LOSE_A_SIGTERM, run_cli

from rlcli.services import checkpoint

RL_EVAL = Path(sys.executable).parent / "rl-eval"
TINY = ["algo=ppo", "env=CartPole-v1", "algo.n_steps=32", "algo.batch_size=64", "train.total_steps=2048",
        "train.test_every=512", "train.test_episodes=3", "train.checkpoint_every=1024", "train.stop_reward=null",
        "log.console=false", "deterministic=true"]


def rl_eval(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`rl-eval args` to its end, forked from the tests' server process as rl-train's runs are (tests/forked_cli.py:
    a process of its own that skips ~2 s of imports; the tests here and in test_video_export start dozens)."""
    env = dict(os.environ, HYDRA_FULL_ERROR="0")
    return forked_cli.run(args, cwd, timeout=300, env=env, program="rl-eval")


def one_line_error(out: subprocess.CompletedProcess) -> str:
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("rl-eval: error: "), out.stderr
    return lines[0]


def test_a_flag_is_one_line_with_the_key_value_form(tmp_path):
    line = one_line_error(rl_eval(str(tmp_path), "--episodes", "3", cwd=tmp_path))
    assert line == "rl-eval: error: unknown flag '--episodes': rl-eval takes key=value options, e.g. episodes=3"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("eval") / "run"
    out = run_cli(*TINY, f"hydra.run.dir={path}", cwd=path.parent)
    assert out.returncode == 0, out.stderr
    return path


def test_best_model_is_the_best_test_phase_and_rl_eval_reproduces_it(run_dir):
    phases = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    means = [sum(p["returns"]) / len(p["returns"]) for p in phases]
    k = means.index(max(means))  # the first phase with the highest mean: later ties do not replace it
    best = checkpoint.load(run_dir / "checkpoints" / "best.pt")
    assert best["env_steps"] == phases[k]["env_steps"] and best["state"]["best_test_return"] == means[k]
    assert "new best test return" in (run_dir / "train.log").read_text()
    # the same envs, seed and deterministic policy as that test phase: the same episodes
    out = rl_eval(str(run_dir), "load=best", "episodes=3", "num_envs=3", f"seed={1 + 100_003 * (k + 1)}",
                  cwd=run_dir.parent)
    assert out.returncode == 0, out.stderr
    record = json.loads((run_dir / "eval" / "best.json").read_text())
    assert record["returns"] == phases[k]["returns"] and record["episodes"] == 3


def test_load_choices_and_a_checkpoint_file(run_dir):
    for args in (["load=last", "episodes=4", "deterministic=false"], ["load=1024", "episodes=2"],
                 [str(run_dir / "checkpoints" / "ckpt_000000001024.pt"), "episodes=2"]):
        target = [] if args[0].endswith(".pt") else [str(run_dir)]
        out = rl_eval(*target, *args, cwd=run_dir.parent)
        assert out.returncode == 0, out.stderr
        assert "return (mean ± std)" in out.stdout
    assert len(json.loads((run_dir / "eval" / "last.json").read_text())["returns"]) == 4


def test_bad_input_is_one_line_and_writes_nothing(run_dir, tmp_path):
    assert "did you mean 'episodes'" in one_line_error(rl_eval(str(run_dir), "epsiodes=3", cwd=tmp_path))
    assert "load=777: no checkpoint" in one_line_error(rl_eval(str(run_dir), "load=777", cwd=tmp_path))
    assert "does not fit env Acrobot-v1" in one_line_error(rl_eval(str(run_dir), "env.id=Acrobot-v1", cwd=tmp_path))
    assert "no such run directory" in one_line_error(rl_eval(str(tmp_path / "nowhere"), cwd=tmp_path))
    empty = tmp_path / "empty"
    (empty / ".hydra").mkdir(parents=True)
    (empty / ".hydra" / "overrides.yaml").write_text("[]\n")
    assert "no test phase ran (train.test_every=0, or it stopped before its first one)" in \
        one_line_error(rl_eval(str(empty), cwd=tmp_path))
    assert "no usable checkpoint" in one_line_error(rl_eval(str(empty), "load=last", cwd=tmp_path))
    # the saved config says which: tests were off, or the run stopped before its first one
    (empty / ".hydra" / "config.yaml").write_text("train: {test_every: 0}\n")
    assert "no test phase ran (train.test_every=0); use load=last" in one_line_error(rl_eval(str(empty), cwd=tmp_path))
    (empty / ".hydra" / "config.yaml").write_text("train: {test_every: 5000}\n")
    assert "no test phase ran (it stopped before its first one); use load=last" in \
        one_line_error(rl_eval(str(empty), cwd=tmp_path))
    assert not (empty / "eval").exists()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gru", "cnn", "her"])
def test_every_network_kind_evaluates(tmp_path, kind):
    args = {"gru": ["algo=ppo", "actor=gru", "env=MemoryCue-v0", "algo.n_steps=16", "algo.batch_size=32",
                    "algo.n_epochs=1"],
            "cnn": ["algo=ppo", "env=PixelGoal-v0", "algo.n_steps=16", "algo.batch_size=64", "algo.n_epochs=1"],
            "her": ["algo=dqn", "env=BitFlipping-v0", "env.kwargs.n_bits=4", "buffer=her", "algo.learning_starts=256",
                    "algo.batch_size=32"]}[kind]
    out = run_cli(*args, "train.total_steps=1024", "train.test_every=512", "train.test_episodes=2",
                  "log.console=false", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    out = rl_eval(str(tmp_path / "run"), "episodes=3", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert len(json.loads((tmp_path / "run" / "eval" / "best.json").read_text())["returns"]) == 3


@pytest.mark.slow
def test_a_sweep_directory_is_one_table_best_first(tmp_path):
    out = run_cli("-m", "seed=1,2", *TINY[:-2], "train.total_steps=512", "train.checkpoint_every=0",
                  f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    out = rl_eval(str(tmp_path / "sweep"), "load=last", "episodes=3", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if "CartPole-v1" in line]
    assert len(rows) == 2
    means = [float(row.split("│")[4].split("±")[0]) for row in rows]
    assert means == sorted(means, reverse=True)


@pytest.mark.slow
def test_resume_drops_a_best_model_written_after_its_checkpoint(run_dir, tmp_path):
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(run_dir), str(copy)], check=True)
    best = copy / "checkpoints" / "best.pt"
    data = checkpoint.load(best)
    checkpoint.write(best, 2048, {k: v for k, v in data.items() if k != "env_steps"})  # as if written at 2048
    out = run_cli(f"resume={copy / 'checkpoints' / 'ckpt_000000001024.pt'}", "train.total_steps=1024", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert not best.exists()  # it belonged to the history after 1024, which this resume replaced


LOST_INTERRUPT = LOSE_A_SIGTERM + """
import sys
from pathlib import Path

import rlcli.entry.rl_eval as rl_eval
from rlcli.entry import cli

run_dir = Path(sys.argv[1])


def evaluate_checkpoint(loaded, options, name):
    lose_a_sigterm()
    print("evaluation went on")
    return rl_eval.Result(run_dir, run_dir / "checkpoints" / "latest", "CartPole-v1", [1.0], [1], 0.1), []


rl_eval.load_agent = lambda path, options, env_overrides: None
rl_eval.evaluate_checkpoint = evaluate_checkpoint
sys.argv = ["rl-eval", str(run_dir / "checkpoints" / "latest")]
cli.evaluate()
"""


def test_a_signal_whose_interrupt_python_ignored_still_stops_rl_eval_before_it_writes(tmp_path):
    """A SIGTERM landing where Python ignores exceptions (a weakref callback) lost its KeyboardInterrupt: rl-eval
    went on, wrote its record and exited 0, with a traceback on stderr. Now it stops before writing, in one line,
    exit 128 + SIGTERM."""
    import signal

    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest").write_bytes(b"")  # the evaluation itself is stubbed: never read
    out = subprocess.run([sys.executable, "-c", LOST_INTERRUPT, str(tmp_path)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 128 + signal.SIGTERM, out.stdout + out.stderr
    assert "evaluation went on" in out.stdout
    assert out.stderr.strip() == "rl-eval: SIGTERM: stopped; nothing was written", out.stderr
    assert not (tmp_path / "eval").exists()


def test_ctrl_c_during_rl_eval_is_one_line_naming_the_signal(run_dir, tmp_path):
    """A Ctrl-C while rl-eval evaluates (or still starts): one line naming the signal, exit 130, no record."""
    import shutil
    import signal
    import time

    run = Path(shutil.copytree(run_dir, tmp_path / "run"))
    shutil.rmtree(run / "eval", ignore_errors=True)
    proc = subprocess.Popen([str(RL_EVAL), str(run), "episodes=1000000"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(6)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT, err
    assert err.strip() == "rl-eval: SIGINT: stopped; nothing was written", err
    assert not (run / "eval").exists()
