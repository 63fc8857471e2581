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
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != "run.lock"}


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
