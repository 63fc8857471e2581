"""Resume replays only what rlcli's own command line could have written (issue 55, item 1), and a resume may change
the optimizer's settings on request to rescue a diverged run (item 6).

Item 1: a run directory is a file anyone may have edited. A line of `.hydra/overrides.yaml` that loads a yaml file
from a path (`hparams_search=../../x`, `collector=`, `+algo@_global_=`, ...), calls a resolver (`${oc.env:...}`),
imports a module (`env.id=mod:Env-v0`) or sets anything under `hydra.` is refused in one line naming the file's line,
before anything runs, through `rl-train resume=<dir>`, `resume=<checkpoint>` and `rlcli.train(resume=...)`.
Each payload here would leave a marker file if it ran; on the main before this file, every one of them did (the
callbacks ran `shutil.copyfile` and the resume exited 0)."""

import os
import shutil
from pathlib import Path

import forked_cli
import pytest
from conftest import run_cli

from rlcli.run.compose import conf_dir
from rlcli.services import checkpoint

TINY = ["algo.n_steps=64", "algo.batch_size=64", "train.num_envs=2", "train.checkpoint_every=256",
        "train.test_every=0", "train.stop_reward=null", "log.console=false"]


def one_line(out) -> str:
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    return lines[0]


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    """A PPO CartPole run of 512 steps with checkpoints at 256 and 512 (copied by each test)."""
    where = tmp_path_factory.mktemp("base")
    out = run_cli(*TINY, "train.total_steps=512", "hydra.run.dir=run", cwd=where)
    assert out.returncode == 0, out.stderr
    return where / "run"


@pytest.fixture
def run_copy(base_run, tmp_path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(base_run, target, ignore=shutil.ignore_patterns(".rlcli.lock"))
    return target


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and p.name != ".rlcli.lock"}


def plant(run_dir: Path, marker: Path) -> Path:
    """A yaml file in the run dir whose Hydra callback copies a file to `marker` when Hydra's run ends."""
    payload = run_dir / ".hydra" / "search.yaml"
    payload.write_text(f"# @package _global_\ncollector:\n  name: local\nhydra:\n  callbacks:\n    x:\n"
                       f"      _target_: shutil.copyfile\n      src: {run_dir / '.hydra' / 'overrides.yaml'}\n"
                       f"      dst: {marker}\n")
    return payload


def path_from_group(group: str, target: Path) -> str:
    """`target` (without .yaml) as a choice of a config group: a path relative to conf/<group>."""
    return os.path.relpath(target.with_suffix(""), Path(conf_dir()) / group)


def add_lines(run_dir: Path, *lines: str) -> int:
    """Append `lines` to the run's overrides.yaml; the file line number of the first one."""
    saved = run_dir / ".hydra" / "overrides.yaml"
    text = saved.read_text()
    saved.write_text(text + "".join(f"- {line}\n" for line in lines))
    return len(text.splitlines()) + 1


GROUP_PAYLOADS = [("hparams_search", "hparams_search={}"), ("collector", "collector={}"),
                  ("algo", "+algo@_global_={}"), ("env", "+env@_global_={}"), ("tuned", "+tuned@_global_={}")]


@pytest.mark.parametrize(("group", "form"), GROUP_PAYLOADS, ids=[g for g, _ in GROUP_PAYLOADS])
def test_a_group_choice_with_a_path_is_refused_on_resume(group, form, run_copy, tmp_path):
    marker = tmp_path / "MARKER"
    line = form.format(path_from_group(group, plant(run_copy, marker)))
    number = add_lines(run_copy, line)
    before = snapshot(run_copy)
    out = run_cli(f"resume={run_copy}", "train.total_steps=1024", cwd=tmp_path)
    assert not marker.exists(), out.stderr  # (on the main before this file, each one ran and exited 0)
    message = one_line(out)
    assert out.returncode == 2, out.stderr
    assert f"{run_copy / '.hydra' / 'overrides.yaml'} line {number} ({line!r})" in message
    assert "is not an override rlcli would have written" in message
    assert snapshot(run_copy) == before


def test_every_way_to_resume_refuses_the_same_line(run_copy, tmp_path):
    """`resume=<checkpoint file>` and rlcli.train(resume=...) go through the same check as `resume=<dir>`."""
    import rlcli

    marker = tmp_path / "MARKER"
    line = f"hparams_search={path_from_group('hparams_search', plant(run_copy, marker))}"
    number = add_lines(run_copy, line)
    before = snapshot(run_copy)
    out = run_cli(f"resume={run_copy / 'checkpoints' / 'ckpt_000000000256.pt'}", cwd=tmp_path)
    assert out.returncode == 2 and f"line {number} ({line!r})" in one_line(out)
    with pytest.raises(rlcli.RlcliError, match=f"line {number} .*not an override rlcli would have written"):
        rlcli.train(resume=run_copy, train={"total_steps": 1024})
    assert not marker.exists() and snapshot(run_copy) == before


@pytest.mark.parametrize("line", ["log.mlflow_experiment=${oc.env:RLCLI_TEST_SECRET}",
                                  "log.wandb_project='x${oc.decode:1}'",
                                  "+hydra.callbacks.x._target_=shutil.copyfile"])
def test_a_resolver_or_a_hydra_key_is_not_replayed(line, run_copy, tmp_path):
    number = add_lines(run_copy, line)
    out = run_cli(f"resume={run_copy}", "train.total_steps=1024", cwd=tmp_path)
    message = one_line(out)
    assert out.returncode == 2 and f"line {number} ({line!r})" in message, out.stderr
    assert ("calls a resolver" in message) != ("not an rlcli setting" in message)


def test_a_resolver_line_given_again_on_the_command_line_is_replaced(run_copy, tmp_path):
    add_lines(run_copy, "log.mlflow_experiment=${oc.env:RLCLI_TEST_SECRET}")
    out = run_cli(f"resume={run_copy}", "train.total_steps=768", "log.mlflow_experiment=mine", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert checkpoint.load(run_copy / "checkpoints" / "ckpt_000000000768.pt")["config"]["log"][
        "mlflow_experiment"] == "mine"


def test_an_entry_point_env_named_by_the_run_dir_is_not_imported(run_copy, tmp_path):
    modules = tmp_path / "modules"
    modules.mkdir()
    marker = tmp_path / "MARKER"
    (modules / "rlcli_marker_env.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    number = add_lines(run_copy, "env=gym", "env.id=rlcli_marker_env:CartPole-v1")
    env = dict(os.environ, HYDRA_FULL_ERROR="0", PYTHONPATH=str(modules))
    out = forked_cli.run([f"resume={run_copy}"], tmp_path, timeout=300, env=env)
    assert not marker.exists(), out.stderr  # (the main before this file imported the module, then refused the id)
    message = one_line(out)
    assert out.returncode == 2, out.stderr
    assert f"line {number + 1} " in message and "env.id=rlcli_marker_env:CartPole-v1 again" in message


def test_an_entry_point_env_id_taken_from_another_setting_is_not_imported(run_copy, tmp_path):
    """`env.id=${env.kwargs.x}` with `env.kwargs.x=mod:Env` named a module through a plain reference, which a
    replayed value may hold: env.id's value may not refer to another setting at all."""
    modules = tmp_path / "modules"
    modules.mkdir()
    marker = tmp_path / "MARKER"
    (modules / "rlcli_marker_env2.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    number = add_lines(run_copy, "env=gym", "+env.kwargs.x=rlcli_marker_env2:CartPole-v1", "env.id=${env.kwargs.x}")
    env = dict(os.environ, HYDRA_FULL_ERROR="0", PYTHONPATH=str(modules))
    out = forked_cli.run([f"resume={run_copy}"], tmp_path, timeout=300, env=env)
    assert not marker.exists(), out.stderr
    assert out.returncode == 2 and f"line {number + 2} " in one_line(out), out.stderr


def drop_config_key(run_dir: Path, section: str, key: str) -> None:
    """Make the run's checkpoints those of an rlcli that did not have `section.key` yet."""
    for path in (run_dir / "checkpoints").glob("ckpt_*.pt"):
        data = checkpoint.load(path)
        data.pop("format")
        steps = data.pop("env_steps")
        del data["config"][section][key]
        checkpoint.write(path, steps, data)


def test_a_run_saved_before_train_step_timeout_existed_resumes(run_copy, tmp_path):
    """A checkpoint of an rlcli without train.step_timeout (this session's new key) has no such key in its config:
    resuming it is not 'a changed train.step_timeout', and a timeout may be added on resume (a hung env's rescue)."""
    drop_config_key(run_copy, "train", "step_timeout")
    out = run_cli(f"resume={run_copy}", "train.total_steps=768", "train.step_timeout=60", cwd=tmp_path)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("choice", ["hparams_search=../../x", "collector=../collector/local"])
def test_a_typed_group_choice_with_a_path_is_one_line(choice, tmp_path):
    out = run_cli(choice, "train.total_steps=256", "hydra.run.dir=run", cwd=tmp_path)
    message = one_line(out)
    assert out.returncode == 2 and f"unknown {choice.split('=')[0]} '{choice.split('=')[1]}'" in message
    assert not (tmp_path / "run").exists()


def test_why_not_replayed():
    from rlcli.run.resume import REPLACED, ReplayContext, owned_roots, why_not_replayed

    groups = {"env", "algo", "actor", "buffer", "collector", "tuned", "hparams_search"}
    context = ReplayContext(owned_roots(), groups, [], set(), False)
    for line, why in [
        ("hparams_search=../../x", "not an option of the config group hparams_search"),
        ("env=ALE/../CartPole-v1", "not an option of the config group env"),
        ("+tuned@_global_=ppo/CartPole-v1", "puts a config into another package"),
        ("algo/x=ppo", "names a config group's folder"),
        ("hydra.job.chdir=true", "is not an rlcli setting"),
        ("seed=1,2", "a sweep"),
        ("+algo.policy_loss_addons.x={_target_: os.system}", "_target_ names code"),
        ("algo.lr='${oc.env:HOME}'", "calls a resolver"),
        ("algo.lr='${now:%H}'", "calls a resolver"),
        ("collector.address=ray://10.0.0.1:10001", "unpickled here"),
        ("env.id=mod:Env-v0", "imports the module 'mod'"),
    ]:
        assert why in (why_not_replayed(line, context) or ""), line
    for fine in ("env=ALE/Pong-v5", "~tuned", "++algo.schedules.lr=linear:0.001:0", "algo.lr_pi=${algo.lr}",
                 "tuned=ppo/CartPole-v1", "hparams_search=null", "actor.hidden_sizes=[32,32]", "env.id=CartPole-v1"):
        assert why_not_replayed(fine, context) is None, fine
    again = ReplayContext(owned_roots(), groups, [], {"env.id", "algo.lr"}, False)
    assert why_not_replayed("env.id=mod:Env-v0", again) == why_not_replayed("algo.lr=${oc.env:X}", again) == REPLACED
    assert why_not_replayed("env.id=mod:Env-v0", ReplayContext(owned_roots(), groups, [], set(), True)) is None


# --------------------------------------------------------------------------- item 6: a resume may change the lr
def test_a_resume_may_lower_the_learning_rate_and_says_so(run_copy, tmp_path):
    """The tuned PPO CartPole run has lr 1e-3 with lr_schedule=linear (lr = base_lr * a factor each update): the
    new base must survive loading the optimizer's saved groups."""
    out = run_cli(f"resume={run_copy}", "algo.lr=1e-4", "train.total_steps=1024", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    message = one_line(out)
    assert "algo.lr 0.001 -> 0.0001 at 512 env steps" in message and "no longer an exact continuation" in message
    assert message.split("warning: ", 1)[1] in (run_copy / "train.log").read_text()
    final = checkpoint.load(run_copy / "checkpoints" / "ckpt_000000001024.pt")
    groups = final["algo"]["optimizer"]["param_groups"]
    assert groups and all(g["base_lr"] == 1e-4 and 0 <= g["lr"] <= 1e-4 for g in groups), groups
    assert final["state"]["changes"] == [{"env_steps": 512, "checkpoint": "ckpt_000000000512.pt",
                                          "settings": {"algo.lr": [0.001, 0.0001]}}]
    # from a checkpoint before the change, the replayed algo.lr=1e-4 is a change this command line did not ask for
    older = run_cli(f"resume={run_copy / 'checkpoints' / 'ckpt_000000000512.pt'}", cwd=tmp_path)
    assert older.returncode == 2 and "give algo.lr=<value> on the resume command line" in one_line(older)


def test_shape_changes_stay_refused_and_name_what_may_change(run_copy, tmp_path):
    out = run_cli(f"resume={run_copy}", "algo.lr=1e-4", "train.num_envs=4", cwd=tmp_path)
    message = one_line(out)
    assert out.returncode == 2 and "train.num_envs (2 -> 4)" in message and "algo.lr (" not in message
    assert "when given on the resume command line" in message and "algo.schedules.*" in message


@pytest.mark.slow
def test_a_diverged_run_is_rescued_by_a_resume_with_a_new_lr_schedule(tmp_path):
    args = [*TINY, "train.total_steps=1024", "algo.schedules.lr=step:0.001:1e30:0.5", "hydra.run.dir=run"]
    out = run_cli(*args, cwd=tmp_path)
    message = one_line(out)
    assert out.returncode == 1 and "non-finite" in message, out.stderr
    assert "add algo.schedules.lr=<schedule> (now step:0.001:1e30:0.5) to the resume command below" in message
    rescued = run_cli(f"resume={tmp_path / 'run'}", "algo.schedules.lr=constant:0.0003", cwd=tmp_path)
    assert rescued.returncode == 0, rescued.stderr
    assert "algo.schedules.lr step:0.001:1e30:0.5 -> constant:0.0003" in one_line(rescued)
    final = checkpoint.load(tmp_path / "run" / "checkpoints" / "ckpt_000000001024.pt")
    assert final["state"]["finished"] and final["state"]["changes"][0]["settings"] == {
        "algo.schedules.lr": ["step:0.001:1e30:0.5", "constant:0.0003"]}
    assert all(g["lr"] == 0.0003 for g in final["algo"]["optimizer"]["param_groups"])


def test_loading_a_checkpoint_keeps_the_changed_settings():
    """The optimizer's saved groups (lr and the base_lr that lr_schedule scales) and a schedulable value kept in
    the algorithm's state (ppo_kl's kl_coef) would bring the old values back; the changed ones stay."""
    import torch

    from rlcli.run.resume import new_settings_kept

    class Algo:
        schedulable = ("kl_coef", "ent_coef")

        def __init__(self, lr: float, kl_coef: float) -> None:
            self.optimizer = torch.optim.Adam([{"params": [torch.nn.Parameter(torch.zeros(2))], "lr": lr,
                                                "base_lr": lr}])
            self.kl_coef, self.ent_coef = kl_coef, 0.0

        def optimizers(self):
            return [self.optimizer]

        def state_dict(self):
            return {"optimizer": self.optimizer.state_dict(), "kl_coef": self.kl_coef}

        def load_state_dict(self, state):
            self.optimizer.load_state_dict(state["optimizer"])
            self.kl_coef = state["kl_coef"]

    saved = Algo(3e-4, 1.0)
    saved.optimizer.param_groups[0]["lr"] = 1.5e-4  # mid-run: base_lr * 0.5
    algo = Algo(1e-4, 0.2)
    with new_settings_kept(algo, [("algo.lr", 3e-4, 1e-4), ("algo.kl_coef", 1.0, 0.2)]):
        algo.load_state_dict(saved.state_dict())
    group = algo.optimizer.param_groups[0]
    assert (group["lr"], group["base_lr"], algo.kl_coef) == (1e-4, 1e-4, 0.2)
    unchanged = Algo(1e-4, 0.2)
    with new_settings_kept(unchanged, []):
        unchanged.load_state_dict(saved.state_dict())
    assert (unchanged.optimizer.param_groups[0]["lr"], unchanged.kl_coef) == (1.5e-4, 1.0)
