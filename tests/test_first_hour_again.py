"""The first hour, second round: what tripped a new user after the README's set-up (issue 27)."""

import subprocess
import sys
from pathlib import Path

import forked_cli
import pytest
from conftest import REPO, RL_TRAIN, run_cli

BIN = Path(sys.executable).parent


@pytest.mark.parametrize("program", ["rl-train", "rl-eval", "rl-report"])
def test_version_is_rlclis(program):
    out = subprocess.run([str(BIN / program), "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"{program} (rlcli) 0.1.0", out
    assert "Hydra" not in out.stdout


@pytest.mark.parametrize(("arg", "suggestion"), [("total_steps=1000", "train.total_steps"),
                                                 ("num_envs=2", "train.num_envs"), ("lr=1e-3", "algo.lr")])
def test_did_you_mean_searches_every_section(arg, suggestion, tmp_path):
    out = run_cli(arg, cwd=tmp_path)
    assert out.returncode == 2 and f"(did you mean '{suggestion}'?)" in out.stderr, out.stderr


def test_a_shipped_tuned_config_does_not_warn_about_its_own_budget():
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from rlcli.run.budget import budget_warnings

    algo = SimpleNamespace(steps_per_collect=32, learning_starts=0)
    c = SimpleNamespace(settings=SimpleNamespace(total_steps=100_000, num_envs=8), algo=algo,
                        learner=SimpleNamespace(algo=algo), spec=SimpleNamespace(on_policy=True),
                        steps_per_phase=32 * 8, offline=None,
                        cfg=OmegaConf.create({"train": {"num_envs": 8}, "collector": {"name": "local"}}))
    assert budget_warnings(c, 100_096, typed={"algo", "env"}) == []  # the flagship command
    # typed, a rounding of at most 1% is not worth a line either (issue 56: the Python guide's first example)
    assert budget_warnings(c, 100_096, typed={"train.total_steps"}) == []
    c.settings.total_steps = 3000
    (short,) = budget_warnings(c, 3072, typed={"train.total_steps"})
    assert "3,072 env steps" in short and "algo.n_steps x train.num_envs dividing it" in short
    c.settings.total_steps = 160
    (tiny,) = budget_warnings(c, 256, typed={"train.total_steps"})
    assert "for exactly 160, algo.n_steps=20" in tiny


def test_a_typed_train_num_envs_that_collector_envs_per_worker_overrides_is_said():
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from rlcli.run.budget import budget_warnings

    algo = SimpleNamespace(steps_per_collect=32, learning_starts=0)
    cfg = OmegaConf.create({"train": {"num_envs": 16},
                            "collector": {"name": "ray", "workers": 2, "envs_per_worker": 3}})
    c = SimpleNamespace(settings=SimpleNamespace(total_steps=192, num_envs=6), algo=algo, cfg=cfg,
                        learner=SimpleNamespace(algo=algo), spec=SimpleNamespace(on_policy=True),
                        steps_per_phase=32 * 6, offline=None)
    (line,) = budget_warnings(c, 192, typed={"train.num_envs", "collector.envs_per_worker"})
    assert line.startswith("train.num_envs=16 is not used: collector.envs_per_worker=3 on collector.workers=2 run 6")
    assert budget_warnings(c, 192, typed={"collector.envs_per_worker"}) == []  # the default num_envs: nothing to say
    cfg.collector.envs_per_worker = None  # num_envs split over the workers: what was asked for
    c.settings.num_envs, c.settings.total_steps, c.steps_per_phase = 16, 512, 32 * 16
    assert budget_warnings(c, 512, typed={"train.num_envs"}) == []


def test_rl_eval_on_a_parent_of_runs_on_several_envs_says_what_it_found(tmp_path):
    for env in ("CartPole-v1", "Acrobot-v1"):
        out = run_cli("algo=ppo", f"env={env}", "algo.n_steps=32", "algo.batch_size=32", "train.num_envs=2",
                      "train.total_steps=64",
                      "train.test_every=0", "log.console=false", f"hydra.run.dir=runs/{env}", cwd=tmp_path)
        assert out.returncode == 0, out.stderr
    out = forked_cli.run(["runs", "load=last"], tmp_path, timeout=120, program="rl-eval")
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert "holds runs on 2 envs" in lines[0] and "Acrobot-v1: 1 run" in lines[0] and "CartPole-v1: 1 run" in lines[0]
    assert not list(tmp_path.rglob("eval/*.json"))  # nothing written
    out = forked_cli.run(["runs/CartPole-v1", "load=last", "episodes=1"], tmp_path, timeout=120, program="rl-eval")
    assert out.returncode == 0, out.stderr


def test_rl_report_plot_without_matplotlib_is_one_line_before_writing(tmp_path, monkeypatch, capsys):
    from rlcli.entry import rl_report as report

    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("- seed=1\n")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(SystemExit) as stop:
        report.main([str(run), "--csv", str(tmp_path / "t.csv"), "--plot", str(tmp_path / "p.png")])
    assert stop.value.code == 2 and "--plot needs matplotlib" in capsys.readouterr().err
    assert not (tmp_path / "t.csv").exists()


def test_mujoco_deprecations_stay_off_the_console(capsys, caplog, monkeypatch):
    from rlcli.envs import library_noise

    monkeypatch.setattr(library_noise, "_seen", set())  # an earlier test in this worker may have built MuJoCo envs
    monkeypatch.setattr(library_noise, "_pending", [])

    text = "compiler attribute 'settotalmass' is deprecated and will be removed in a future release: scale ..."
    for _ in range(11):
        library_noise._on_mujoco_warning(text)
    library_noise._on_mujoco_warning("something else went wrong")
    err = capsys.readouterr().err
    assert "settotalmass" not in err and err.count("something else went wrong") == 1
    with caplog.at_level("INFO", logger="rlcli"):
        library_noise.log_pending()
        library_noise.log_pending()
    assert sum("settotalmass" in r.getMessage() for r in caplog.records) == 1


def test_make_train_says_how_to_put_the_commands_on_the_path():
    makefile = (REPO / "Makefile").read_text()
    train_recipe = makefile.split("\ntrain:", 1)[1].split("\n\n", 1)[0]
    assert ". $(VENV)/bin/activate" in train_recipe
    readme = (REPO / "README.md").read_text()
    setup = readme.split("## Set up, train, test", 1)[1].split("\n## ", 1)[0]
    assert ". .venv/bin/activate" in setup
    assert "pip install 'rlcli[" not in readme  # one install form throughout: pip install -e '.[extra]'


def test_rl_train_version_needs_no_config(tmp_path):
    out = subprocess.run([str(RL_TRAIN), "-V"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "rlcli" in out.stdout and not any(tmp_path.iterdir())
