"""`rl-train` builds a run once (the pre-check's components are the ones that train), reads a checkpoint
to resume once, and refuses a checkpoint of another payload layout in one line."""

import sys

import pytest

import rlcli.run.state as run_state
from rlcli.entry.rl_train import main
from rlcli.services import checkpoint

TINY = ["algo=ppo", "env=CartPole-v1", "algo.n_steps=32", "train.total_steps=512", "train.test_every=256",
        "train.test_episodes=2", "log.console=false", "log.tensorboard=false"]


def train(monkeypatch, args):
    monkeypatch.setattr(sys, "argv", ["rl-train", *args])
    main(list(args))


def test_a_run_is_built_once_and_its_checkpoint_read_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    builds, reads = [], []
    real_build, real_read = run_state.build, checkpoint._read_file
    monkeypatch.setattr(run_state, "build", lambda cfg, *args: builds.append(1) or real_build(cfg, *args))
    monkeypatch.setattr(checkpoint, "_read_file", lambda path: reads.append(path) or real_read(path))
    run_dir = tmp_path / "run"
    train(monkeypatch, [*TINY, f"hydra.run.dir={run_dir}"])
    assert len(builds) == 1
    builds.clear()
    train(monkeypatch, [f"resume={run_dir}", "train.total_steps=1024"])
    assert len(builds) == 1
    # resume=<dir> found and verified the checkpoint; the restore used those bytes (best.pt is read apart)
    assert [p.name for p in reads if p.name.startswith("ckpt_")] == ["ckpt_000000000512.pt"]
    assert checkpoint.load(checkpoint.resolve(run_dir))["state"]["env_steps"] == 1024


def test_a_checkpoint_of_an_older_layout_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"
    train(monkeypatch, [*TINY, f"hydra.run.dir={run_dir}"])
    path = checkpoint.resolve(run_dir)
    data = checkpoint.load(path)
    data.pop("payload_version")
    data["algo"]["actor"] = data["algo"].pop("networks")
    path.unlink()
    checkpoint.save(path.parent, data.pop("env_steps"), data, keep=3)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        train(monkeypatch, [f"resume={run_dir}", "train.total_steps=1024"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and "layout-1 checkpoint" in err[0], err
    # its networks still warm-start a new run
    train(monkeypatch, [*TINY, f"actor.init_from={path}", f"hydra.run.dir={tmp_path / 'warm'}"])
    assert checkpoint.resolve(tmp_path / "warm").is_file()
