"""The faults of the reading side (issue 55): a checkpoint or run directory never imports a module it names, an
env that fails under rl-eval is one line, and the Python API's bad arguments are one-line exceptions of the kinds
Python code catches (TypeError, ValueError, FileNotFoundError), never a deep traceback.

One tiny run on an entry-point env (`faulty_env:Faulty-v0`, as a user's own `mymodule:MyEnv-v0` would be) is shared
by every case; each case fails on the main branch before issue 55's loading fixes."""

import os
import shutil
import sys
import uuid
import warnings
from pathlib import Path

import forked_cli
import numpy as np
import pytest
from test_faults import FAULT_ENVS, RL_EVAL, RL_REPORT, RL_TRAIN, one_line, run

import rlcli
from rlcli.services import checkpoint

ENV_ID = "faulty_env:Faulty-v0"
TINY = ["algo=ppo", "env=gym", f"env.id={ENV_ID}", "train.total_steps=512", "algo.n_steps=64", "algo.batch_size=64",
        "train.num_envs=2", "train.test_every=256", "train.test_episodes=2", "train.checkpoint_every=256",
        "log.console=false", "train.stop_reward=null"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A finished run on an entry-point env: checkpoints at 256 and 512 env steps and a best model (tests that
    change it work on a copy)."""
    where = tmp_path_factory.mktemp("tiny")
    out = run(RL_TRAIN, *TINY, "hydra.run.dir=run", cwd=where)
    assert out.returncode == 0, out.stderr
    return where / "run"


@pytest.fixture
def run_copy(tiny_run, tmp_path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(tiny_run, target, ignore=shutil.ignore_patterns(".rlcli.lock"))
    return target


@pytest.fixture
def fault_envs_importable(monkeypatch):
    """This process can import faulty_env (as the user's own env module is importable where they work)."""
    monkeypatch.syspath_prepend(str(FAULT_ENVS))


def rl_eval(*args: str, cwd: Path, pythonpath: Path | None = None):
    if pythonpath is None:
        return run(RL_EVAL, *args, cwd=cwd)
    env = dict(os.environ, HYDRA_FULL_ERROR="0", PYTHONPATH=os.pathsep.join([str(pythonpath), str(FAULT_ENVS)]))
    return forked_cli.run(args, cwd, timeout=300, env=env, program="rl-eval")


def evil_checkpoint(tiny_run: Path, where: Path) -> tuple[Path, str, Path]:
    """A data-only checkpoint (the tiny run's best model) whose config names `env.id=<module>:CartPole-v1`, and that
    module beside it, which writes a marker file when imported. Returns (checkpoint, module name, marker)."""
    module = f"evilmod_{uuid.uuid4().hex[:8]}"  # a fresh name: this process may import the module once, in a case
    marker = where / "IMPORTED"
    (where / f"{module}.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n")
    data = checkpoint.load(tiny_run / "checkpoints" / "best.pt")
    data.pop("format")
    steps = data.pop("env_steps")
    data["config"]["env"]["id"] = f"{module}:CartPole-v1"  # the same spaces as Faulty-v0: the weights fit
    # in a checkpoints/ folder: rl-eval writes its record beside it, to <where>/eval/
    return checkpoint.write(where / "checkpoints" / "model.pt", steps, data), module, marker


# ------------------------------------------------------------------- a file never imports what it names
def test_rl_eval_and_export_never_import_a_module_that_a_checkpoint_names(tiny_run, tmp_path):
    model, module, marker = evil_checkpoint(tiny_run, tmp_path)
    run_dir = tmp_path / "evil_run"
    shutil.copytree(tiny_run, run_dir, ignore=shutil.ignore_patterns(".rlcli.lock"))
    shutil.copy(model, run_dir / "checkpoints" / "best.pt")
    for args in ([str(model)], [str(run_dir)], [str(model), "export=torchscript"]):
        out = rl_eval(*args, "episodes=1", cwd=tmp_path, pythonpath=tmp_path)
        line = one_line(out, code=2)
        assert not marker.exists(), args
        assert f"env.id={module}:CartPole-v1" in line and "trusted_checkpoint=true" in line, line
    # the user names it again (or says the file is trusted): then it is built, as they asked
    for named in ([f"env.id={module}:CartPole-v1"], ["trusted_checkpoint=true"]):
        out = rl_eval(str(model), "episodes=1", *named, cwd=tmp_path, pythonpath=tmp_path)
        assert out.returncode == 0, out.stderr
        assert marker.exists()
        marker.unlink()


def test_rlcli_load_never_imports_a_module_that_a_checkpoint_names(tiny_run, tmp_path, monkeypatch):
    model, module, marker = evil_checkpoint(tiny_run, tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(rlcli.RlcliError) as error:
        rlcli.load(model)
    assert not marker.exists() and module not in sys.modules
    assert f"env='{module}:CartPole-v1'" in str(error.value) and "\n" not in str(error.value)
    policy = rlcli.load(model, env=f"{module}:CartPole-v1")  # named by the user: built
    assert marker.exists() and policy.env_id == "CartPole-v1"


def test_a_checkpoint_whose_config_holds_an_interpolation_is_refused_without_reading_the_machine(tiny_run,
                                                                                                 tmp_path):
    """rlcli saves a checkpoint's config resolved: a `${oc.env:...}` in one was written by hand, and resolving it would
    read this machine's environment (its value could then show in a message)."""
    data = checkpoint.load(tiny_run / "checkpoints" / "best.pt")
    data.pop("format")
    steps = data.pop("env_steps")
    data["config"]["env"]["id"] = "${oc.env:RLCLI_TEST_SECRET}"
    model = checkpoint.write(tmp_path / "checkpoints" / "model.pt", steps, data)
    line = one_line(rl_eval(str(model), "episodes=1", cwd=tmp_path), code=2)
    assert "interpolation" in line and "was not read" in line, line
    os.environ["RLCLI_TEST_SECRET"] = "s3cret-value"
    try:
        with pytest.raises(rlcli.RlcliError) as error:
            rlcli.load(model)
    finally:
        del os.environ["RLCLI_TEST_SECRET"]
    assert "interpolation" in str(error.value) and "s3cret-value" not in str(error.value)


def test_a_run_on_the_users_own_env_module_evaluates_when_the_user_names_it(tiny_run, tmp_path):
    out = rl_eval(str(tiny_run), "episodes=2", cwd=tmp_path)  # a fresh process: faulty_env is not imported yet
    line = one_line(out, code=2)
    assert f"pass env.id={ENV_ID}" in line, line
    out = rl_eval(str(tiny_run), "episodes=2", f"env.id={ENV_ID}", cwd=tmp_path)
    assert out.returncode == 0 and "Faulty-v0" in out.stdout, out.stderr


def test_an_env_module_that_fails_on_import_is_one_line_naming_its_line(tiny_run, tmp_path):
    (tmp_path / "broken_env_module.py").write_text("import gymnasium\n\nraise RuntimeError('no licence file')\n")
    out = rl_eval(str(tiny_run), "episodes=1", "env.id=broken_env_module:CartPole-v1", cwd=tmp_path,
                  pythonpath=tmp_path)
    line = one_line(out, code=2)
    assert "importing module 'broken_env_module' raised RuntimeError: no licence file (broken_env_module.py:3)" in line


# ------------------------------------------------------------------- an env that fails under rl-eval
@pytest.mark.parametrize("fault, says", [
    ("raise", "env Faulty-v0 raised RuntimeError: simulator exploded at step 20 of one of episodes 0-1"),
    ("nan_obs", "env Faulty-v0 returned a non-finite observation"),
    ("inf_reward", "env Faulty-v0 returned a non-finite reward (inf) at step 20 of episode 0 (seed 0)"),
])
def test_rl_eval_on_an_env_that_fails_is_one_line_naming_the_env_and_the_episode(tiny_run, tmp_path, fault, says):
    out = rl_eval(str(tiny_run), "episodes=2", "load=last", f"env.id={ENV_ID}", f"env.kwargs.fault={fault}",
                  "env.kwargs.at=20", cwd=tmp_path)
    line = one_line(out, code=1)
    assert says in line, line
    assert "episode 0 (seed 0)" in line or fault == "raise", line
    assert not (tiny_run / "eval" / "last.json").exists()  # a failed evaluation is not recorded as a score


def test_rlcli_evaluate_on_an_env_that_fails_raises_one_line_with_the_envs_own_error_attached(
        tiny_run, fault_envs_importable):
    policy = rlcli.load(tiny_run, env=ENV_ID)
    with pytest.raises(rlcli.RlcliError) as error:
        rlcli.evaluate(policy, env=lambda: __import__("faulty_env").FaultyEnv("nan_obs", at=3), episodes=1)
    assert "non-finite observation" in str(error.value) and "step 3 of episode 0" in str(error.value)


# ------------------------------------------------------------------- the Python API's bad arguments
def test_python_api_bad_arguments_are_one_line_type_or_value_errors(tiny_run, tmp_path, fault_envs_importable):
    def raised(call, kind):
        with pytest.raises(kind) as error:
            call()
        message = str(error.value)
        assert isinstance(error.value, rlcli.RlcliError) and "\n" not in message, message
        # no chain of internal exceptions under it
        assert error.value.__cause__ is None and (error.value.__suppress_context__ or error.value.__context__ is None)
        return message

    assert "path=123 is not a path" in raised(lambda: rlcli.load(123), TypeError)
    assert "no such run directory" in raised(lambda: rlcli.load(tmp_path / "nowhere"), FileNotFoundError)
    assert "'best', 'last'" in raised(lambda: rlcli.load(tiny_run, load="first"), ValueError)
    assert "rlcli.load(" in raised(lambda: rlcli.evaluate(None), TypeError)
    assert "rlcli.evaluate(rlcli.load('runs/x'))" in raised(lambda: rlcli.evaluate("runs/x"), TypeError)
    assert "rlcli.load(" in raised(lambda: rlcli.export(tmp_path), TypeError)
    message = raised(lambda: rlcli.train(train=1000, run_dir=tmp_path / "made"), TypeError)
    assert "train=1000" in message and "train={'total_steps'" in message, message
    assert not (tmp_path / "made").exists()
    policy = rlcli.load(tiny_run, env=ENV_ID)
    assert "non-finite" in raised(lambda: policy.predict([0.0, np.nan, 0.0, 0.0]), ValueError)
    assert "non-finite" in raised(lambda: policy.predict(np.full((2, 4), np.inf)), ValueError)
    assert "complex" in raised(lambda: policy.predict(np.array([1j, 0, 0, 0])), ValueError)
    assert "not numbers" in raised(lambda: policy.predict(["a", "b", "c", "d"]), TypeError)
    action, _ = policy.predict(np.zeros(4, np.float32))  # a good observation still acts
    assert action in (0, 1)


# ------------------------------------------------------------------- misleading or quiet
def test_load_last_says_when_it_skips_a_truncated_newest_checkpoint(run_copy, tmp_path, fault_envs_importable):
    newest = run_copy / "checkpoints" / "ckpt_000000000512.pt"
    newest.write_bytes(newest.read_bytes()[:1000])
    out = rl_eval(str(run_copy), "load=last", "episodes=1", f"env.id={ENV_ID}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("rl-eval: warning: load=last: "), out.stderr
    assert "ckpt_000000000512.pt is corrupted or truncated" in lines[0] and "ckpt_000000000256.pt" in lines[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        policy = rlcli.load(run_copy, load="last", env=ENV_ID)
    assert policy.checkpoint.name == "ckpt_000000000256.pt"
    assert any("ckpt_000000000512.pt is corrupted" in str(w.message) for w in caught), [str(w.message) for w in caught]


def test_a_raw_pickle_in_the_new_format_is_refused_with_a_reason_and_no_torch_warning(tmp_path):
    import hashlib
    import pickle

    marker = tmp_path / "PWNED"
    body = pickle.dumps({"env_steps": 1, "evil": Payload(marker)}, protocol=4)
    path = tmp_path / "raw.pt"
    path.write_bytes(checkpoint._HEADER.pack(checkpoint.MAGIC, checkpoint.FORMAT_VERSION,
                                             hashlib.sha256(body).digest()) + body)
    out = rl_eval(str(path), cwd=tmp_path)
    line = one_line(out, code=2)
    assert "Warning" not in out.stderr and "()" not in line, out.stderr
    assert "raw.pt holds a raw pickle (protocol 4)" in line and not marker.exists(), line


class Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_rl_eval_that_cannot_write_its_record_prints_the_table_then_says_what_it_could_not_write(run_copy, tmp_path):
    shutil.rmtree(run_copy / "eval", ignore_errors=True)  # (another case's record)
    (run_copy / "eval" / "best.json").mkdir(parents=True)  # unwritable even for root (the tests' CI user)
    out = rl_eval(str(run_copy), "episodes=2", f"env.id={ENV_ID}", cwd=tmp_path)
    line = one_line(out, code=1)
    assert "return (mean ± std)" in out.stdout  # the results are shown
    assert line.startswith("rl-eval: error: the results above were not recorded: cannot write ") and \
        "eval/best.json" in line, line


def test_rl_report_reads_a_run_whose_hydra_files_hold_the_wrong_shapes(run_copy, tmp_path):
    (run_copy / ".hydra" / "hydra.yaml").write_text("- a\n- b\n")
    (run_copy / ".hydra" / "config.yaml").write_text("just a string\n")
    (run_copy / "status.json").write_text("[1, 2]\n")
    out = run(RL_REPORT, str(run_copy), cwd=tmp_path)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert "ppo" in out.stdout and "512" in out.stdout
