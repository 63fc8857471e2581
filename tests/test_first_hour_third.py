"""The first hour, third round (issue 56): set-up that does what it says, a silently wrong env, training longer after
a stop at the stop reward, docs that match the code, warnings and hints, MLflow's files, a quick contributor check."""

import hashlib
import importlib.util
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, run_cli

from rlcli.registry import ConfigError
from rlcli.run.compose import compose_config


def one_line_error(out: subprocess.CompletedProcess) -> str:
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("rl-train: error: "), out.stderr
    return lines[0]


# ------------------------------------------------------------------ 1. set-up installs torch's CPU build for real
def _install_torch():
    spec = importlib.util.spec_from_file_location("install_torch", REPO / "scripts" / "install_torch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _report(*names_versions):
    return {"install": [{"metadata": {"name": n, "version": v}} for n, v in names_versions]}


def test_set_up_takes_torch_from_pytorchs_cpu_index_where_it_answers():
    t = _install_torch()
    never = lambda requirement: pytest.fail("no dry run where the CPU index answers")  # noqa: E731
    args, line = t.plan("cpu", "2.13.0", t.PYTORCH_INDEX, lambda url: None, never)
    assert args == ["install", "--quiet", "--index-url", "https://download.pytorch.org/whl/cpu", "torch==2.13.0"]
    assert "about 200 MB" in line
    args, line = t.plan("cu128", "2.13.0", t.PYTORCH_INDEX, lambda url: None, never)
    assert args[2:4] == ["--index-url", "https://download.pytorch.org/whl/cu128"] and "several GB" in line
    assert t.plan("pypi", "2.13.0", t.PYTORCH_INDEX, never, never)[0] == ["install", "--quiet", "torch==2.13.0"]


def test_set_up_falls_back_to_the_plain_name_only_where_that_is_a_cpu_build():
    t = _install_torch()
    offline = lambda url: "Name or service not known"  # noqa: E731
    cpu = lambda requirement: _report(("torch", "2.13.0+cpu"), ("sympy", "1.14.0"))  # noqa: E731
    args, line = t.plan("cpu", "2.13.0", t.PYTORCH_INDEX, offline, cpu)
    assert args == ["install", "--quiet", "torch==2.13.0"] and "not reachable" in line and "2.13.0+cpu" in line
    cuda = lambda requirement: _report(("torch", "2.13.0"), *[(f"nvidia-lib{i}", "12") for i in range(20)])  # noqa: E731
    with pytest.raises(SystemExit) as refused:
        t.plan("cpu", "2.13.0", t.PYTORCH_INDEX, offline, cuda)
    assert "is a CUDA build" in str(refused.value) and "20 nvidia-* packages" in str(refused.value)
    assert "TORCH=pypi" in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(SystemExit) as refused:
        t.plan("cu128", "2.13.0", t.PYTORCH_INDEX, offline, cpu)
    assert "no cu128 build" in str(refused.value)


def test_make_passes_the_torch_switch_to_the_installer(tmp_path):
    venv = tmp_path / "venv"
    out = subprocess.run(["make", "-n", f"VENV={venv}", "TORCH=cu128", f"{venv}/bin/rl-train"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"{venv}/bin/python scripts/install_torch.py --build cu128 --version 2.13.0" in out.stdout
    assert "pip install --quiet torch" not in out.stdout  # never the plain name unchecked
    plain = subprocess.run(["make", "-n", f"VENV={venv}", f"{venv}/bin/rl-train"], cwd=REPO, capture_output=True,
                           text=True, timeout=60)
    assert "--build cpu" in plain.stdout
    setup = (REPO / "README.md").read_text().split("## Set up, train, test", 1)[1].split("\n## ", 1)[0]
    assert "https://download.pytorch.org/whl/cpu" in setup and "TORCH=cu128" in setup and "MB" in setup


# ------------------------------------------------------------------ 3. env.id without env= is not CartPole's run
def test_env_id_without_env_choice_is_refused_naming_the_command(tmp_path):
    line = one_line_error(run_cli("env.id=FrozenLake-v1", cwd=tmp_path))
    assert "env=gym env.id=FrozenLake-v1" in line and "env=CartPole-v1's config" in line
    assert not (tmp_path / "runs").exists()
    with pytest.raises(ConfigError, match=r"write env=LunarLander-v3 \(its shipped config\)"):
        compose_config(["env.id=LunarLander-v3"])
    assert compose_config(["env=gym", "env.id=FrozenLake-v1"]).env.id == "FrozenLake-v1"
    assert compose_config(["env.id=CartPole-v1"]).env.id == "CartPole-v1"  # the default's own id changes nothing
    # a typed env= is the user's choice: a shipped config reused for another id
    assert compose_config(["env=Acrobot-v1", "env.id=CartPole-v1"]).env.id == "CartPole-v1"


# ------------------------------------------------------------------ 4. training longer after a stop-reward stop
def _digests(run: Path) -> dict[str, str]:
    files = [*sorted((run / ".hydra").iterdir()), run / "train.log", run / "eval.jsonl"]
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


def test_a_raised_budget_trains_on_after_the_stop_reward_and_a_no_op_resume_writes_nothing(tmp_path):
    tiny = ["algo.n_steps=32", "algo.batch_size=64", "train.num_envs=4", "train.test_every=128",
            "train.test_episodes=1", "log.console=false", "log.tensorboard=false"]
    out = run_cli(*tiny, "train.total_steps=4096", "train.stop_reward=1", "hydra.run.dir=run", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    run = tmp_path / "run"
    assert [p.name for p in (run / "checkpoints").glob("ckpt_*.pt")] == ["ckpt_000000000128.pt"]
    out = run_cli("resume=run", "train.total_steps=384", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "reached its stop reward at 128 env steps" in out.stderr and "train.stop_reward=null" in out.stderr
    assert (run / "checkpoints" / "ckpt_000000000384.pt").is_file()  # it trained on, past the stop reward
    assert "train.stop_reward=null" in (run / ".hydra" / "overrides.yaml").read_text()
    before = _digests(run)
    for again in (["train.total_steps=256"], [], ["train.total_steps=512", "train.stop_reward=1"]):
        out = run_cli("resume=run", *again, cwd=tmp_path)
        assert out.returncode == 0 and "already finished at 384 env steps" in out.stderr, (again, out.stderr)
        assert "nothing was changed" in out.stderr
        assert _digests(run) == before, again  # .hydra/config.yaml, overrides.yaml, train.log as they were
    assert "give a higher train.stop_reward" in out.stderr


# ------------------------------------------------------------------ 7. warnings and hints
def test_a_budget_rounded_up_by_at_most_one_percent_does_not_warn():
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from rlcli.run.budget import budget_warnings

    algo = SimpleNamespace(steps_per_collect=32, learning_starts=0)
    c = SimpleNamespace(settings=SimpleNamespace(total_steps=100_000, num_envs=8), algo=algo,
                        learner=SimpleNamespace(algo=algo), spec=SimpleNamespace(on_policy=True),
                        steps_per_phase=32 * 8, offline=None,
                        cfg=OmegaConf.create({"train": {"num_envs": 8}, "collector": {"name": "local"}}))
    # the Python guide's first example: train={"total_steps": 100_000} with the tuned 32 x 8 rollouts
    assert budget_warnings(c, 100_096, typed={"train.total_steps"}) == []
    c.settings.total_steps = 3000
    assert len(budget_warnings(c, 3072, typed={"train.total_steps"})) == 1  # 2.4%: said


def test_a_sweep_says_its_budget_warning_once(tmp_path):
    out = run_cli("-m", "seed=0,1", "train.total_steps=600", "train.test_every=0", "log.console=false",
                  "log.tensorboard=false", "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("warning: train.total_steps=600 is not a whole number of collect phases") == 1
    for job in ("0", "1"):  # each job's own record keeps it
        assert "train.total_steps=600 is not a whole number" in (tmp_path / "sweep" / job / "train.log").read_text()


@pytest.mark.slow
def test_a_population_sweep_says_its_budget_warning_once(tmp_path):
    out = run_cli("-m", "seed=0,1,2,3", "hydra/launcher=population", "train.total_steps=600", "train.test_every=0",
                  "log.console=false", "log.tensorboard=false", "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("warning: train.total_steps=600 is not a whole number of collect phases") == 1


@pytest.mark.parametrize(("args", "said"), [
    (["algo.lr=3e-4,1e-3"], "algo.lr=3e-4,1e-3 gives several values: add -m for a sweep"),
    (["train.total_step=1000"], "unknown key 'train.total_step' (did you mean 'train.total_steps'?)"),
    (["hydra/launcher=popluation"], "unknown hydra/launcher 'popluation' (did you mean 'population'?)"),
])
def test_hints_name_the_fix(args, said):
    with pytest.raises(ConfigError) as error:
        compose_config(args)
    assert said in str(error.value) and "\n" not in str(error.value)


def test_rl_eval_export_checks_rl_evals_own_episode_0(tmp_path):
    import json
    import re

    import forked_cli

    out = run_cli("algo.n_steps=32", "algo.batch_size=64", "train.num_envs=4", "train.total_steps=512",
                  "train.test_every=0", "log.console=false", "log.tensorboard=false", "hydra.run.dir=run", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    scored = forked_cli.run(["run", "load=last"], tmp_path, timeout=300, program="rl-eval")
    assert scored.returncode == 0, scored.stderr
    first = json.loads((tmp_path / "run" / "eval" / "last.json").read_text())["returns"][0]
    exported = forked_cli.run(["run", "load=last", "export=torchscript"], tmp_path, timeout=300, program="rl-eval")
    assert exported.returncode == 0, exported.stderr
    said = re.search(r"episode 0 of rl-eval <run> \(seed 0\): return (\S+) with the file, (\S+) with rlcli",
                     exported.stdout)
    assert said and float(said.group(1)) == float(said.group(2)) == first, exported.stdout


# ------------------------------------------------------------------ 9. MLflow's files under the runs folder
def test_mlflow_defaults_to_the_runs_folder(tmp_path, monkeypatch):
    from rlcli.services.tracking import default_mlflow_uri, with_default_store
    from rlcli.services.tracking_sinks import TrackingSettings, artifacts_beside

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run = tmp_path / "runs" / "ppo" / "CartPole-v1" / "2026-11-27_10-00-00-000000"
    assert default_mlflow_uri(run) == f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    assert artifacts_beside(default_mlflow_uri(run), "ppo-CartPole-v1") == (
        tmp_path / "runs" / "mlartifacts" / "ppo-CartPole-v1").as_uri()
    elsewhere = tmp_path / "multirun" / "2026-11-27" / "0"  # a sweep's job: ./runs of the working directory
    assert default_mlflow_uri(elsewhere) == f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    on = TrackingSettings(mlflow=True)
    assert with_default_store(on, run).mlflow_uri == default_mlflow_uri(run)
    mine = TrackingSettings(mlflow=True, mlflow_uri="sqlite:////data/m.db")  # overridable: log.mlflow_uri
    assert with_default_store(mine, run) is mine
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")  # or MLflow's own variable
    assert with_default_store(on, run).mlflow_uri is None
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.slow
def test_a_tracked_run_leaves_no_mlflow_files_in_the_working_directory(tmp_path):
    pytest.importorskip("mlflow", reason="the [mlflow] extra (in [dev]) is not installed")
    out = run_cli("algo.n_steps=32", "algo.batch_size=64", "train.num_envs=4", "train.total_steps=256",
                  "train.test_every=0", "log.console=false", "log.tensorboard=false", "log.mlflow=true", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
    runs = tmp_path / "runs"
    assert (runs / "mlflow.db").is_file() and (runs / "mlartifacts" / "ppo-CartPole-v1").is_dir()


# ------------------------------------------------------------------ 6. docs that match the code
def test_a_callback_point_with_the_wrong_arguments_is_named_before_the_run():
    import rlcli
    from rlcli.run.callbacks import CallbackList

    class AsTheGuideOnceSaid(rlcli.Callback):
        def after_update(self, run):  # the guide said each point "gets a RunContext"
            return None

    with pytest.raises(TypeError, match=r"AsTheGuideOnceSaid.after_update must take \(self, run, metrics\)"):
        CallbackList([AsTheGuideOnceSaid()])

    class Fine(rlcli.Callback):
        def after_test(self, run, result):
            return None

        def on_end(self, *args):
            pass

    CallbackList([Fine()])
    guide = (REPO / "docs" / "guide" / "python.md").read_text()
    assert "after_update(run, metrics)" in guide and "Each gets a `RunContext`" not in guide


def test_docstring_placeholders_survive_the_reference_page():
    spec = importlib.util.spec_from_file_location("griffe_placeholders", REPO / "docs" / "griffe_placeholders.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.escape_placeholders("runs/<algo>/<env>/<time stamp> here, `runs/<algo>` in code") == (
        "runs/&lt;algo&gt;/&lt;env&gt;/&lt;time stamp&gt; here, `runs/<algo>` in code")
    assert "docs/griffe_placeholders.py:Placeholders" in (REPO / "mkdocs.yml").read_text()


def test_the_docs_commands_and_pointers_say_what_they_do():
    readme = (REPO / "README.md").read_text()
    assert "mkdocs build --strict`" not in readme and "make docs-build" in readme  # no end-of-life banner
    makefile = (REPO / "Makefile").read_text()
    assert "NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict" in makefile.split("\ndocs-build:", 1)[1]
    troubleshooting = (REPO / "docs" / "troubleshooting.md").read_text()
    assert '"What rlcli guarantees" above' not in troubleshooting
    assert "(guide/checkpoints.md#what-rlcli-guarantees)" in troubleshooting


# ------------------------------------------------------------------ 10. a quick check for contributors
def test_make_quick_runs_the_unit_test_files_that_exist_and_the_readme_says_its_time():
    out = subprocess.run(["make", "-n", "quick"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    pytest_line = next(line for line in out.stdout.splitlines() if "-m pytest" in line)
    assert '-m "not slow"' in pytest_line
    files = [word for word in pytest_line.split() if word.startswith("tests/")]
    assert len(files) >= 20 and all((REPO / f).is_file() for f in files)
    assert not {"tests/test_learning.py", "tests/test_cli.py", "tests/test_sweep.py"} & set(files)
    readme = (REPO / "README.md").read_text()
    assert "make quick" in readme and "about 3 minutes" in readme
    assert "    make test " in readme  # the test command stays what .ci/run runs


# ------------------------------------------------- lines a new user's trial found wrong (issue 58's second round)
def test_a_zero_return_reads_as_the_progress_table_writes_it():
    from rlcli.services.log import fmt_return

    assert [fmt_return(v) for v in (0.0, -0.0, 0.5, -0.25, 7.0, -170.24, None)] == \
        ["0.0", "-0.0", "0.5", "-0.25", "7.0", "-170.2", "-"]


def test_the_header_names_the_config_chosen_and_the_algorithm_it_runs():
    from omegaconf import OmegaConf

    from rlcli.run.trainer import header_labels

    cfg = OmegaConf.create({"algo": {"name": "ppo"}, "env": {"id": "mpe2.simple_spread_v3"}})
    assert header_labels(cfg, {"algo": "ippo", "env": "simple_spread_v3"}) == {
        "algo_label": "ippo (ppo)", "env_label": "simple_spread_v3 (mpe2.simple_spread_v3)"}
    cfg = OmegaConf.create({"algo": {"name": "ppo"}, "env": {"id": "CartPole-v1"}})
    assert header_labels(cfg, {"algo": "ppo", "env": "CartPole-v1"}) == {"algo_label": None, "env_label": None}
    assert header_labels(cfg, {}) == {"algo_label": None, "env_label": None}  # no Hydra choices (a plain compose)
    cfg = OmegaConf.create({"algo": {"name": "ppo", "groups": {"prey": {"name": "a2c"}, "adversary": {"lr": 1e-3}}},
                            "env": {"id": "mpe2.simple_tag_v3"}})
    assert header_labels(cfg, {"algo": "ippo"})["algo_label"] == "ippo (ppo; prey: a2c)"


def test_a_sweeps_overrides_read_as_typed():
    from rlcli.sweeps.jobs import as_typed, shown_overrides

    assert shown_overrides(["compile=True", "env.joint=False", "algo.name=True_x", "seed=1", "resume=auto"]) == \
        "compile=true env.joint=false algo.name=True_x seed=1"
    assert as_typed("env.kwargs.flag") == "env.kwargs.flag"
    # rl-train makes algo.groups.* (and algo.schedules.*, algo.policy_loss_addons.*) `++` for Hydra; shown as typed
    assert shown_overrides(["++algo.groups.right.name=a2c", "++algo.schedules.ent_coef=linear:0.01:0", "++x.y=1"]) \
        == "algo.groups.right.name=a2c algo.schedules.ent_coef=linear:0.01:0 ++x.y=1"


@pytest.mark.slow
def test_an_ippo_run_says_ippo_and_a_launcher_without_m_is_said(tmp_path):
    pytest.importorskip("pettingzoo")
    out = run_cli("algo=ippo", "env=coop_match", "train.total_steps=64", "algo.n_steps=8", "algo.batch_size=32",
                  "train.test_every=0",
                  "hydra/launcher=population", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "rl-train: warning: hydra/launcher=population launches the jobs of a -m sweep; without -m this command " \
           "is one run" in out.stderr
    assert "rlcli: ippo (ppo) on coop_match (" in out.stderr + out.stdout
