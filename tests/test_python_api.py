"""rlcli from Python, through the public names only (what `help(rlcli)` lists), as a notebook would use them."""

import inspect
import json
import os
import re
import signal
import subprocess
import sys

import forked_cli
import gymnasium as gym
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import rlcli

TINY = {"total_steps": 2048, "test_every": 1024, "test_episodes": 2, "log_every": 1024}
QUIET = {"console": False}


@pytest.mark.slow
def test_notebook_train_cartpole_to_475_then_load_predict_evaluate_export(tmp_path):
    run = rlcli.train(algo="ppo", env="CartPole-v1", seed=1, train={"test_every": 5000}, log=QUIET,
                      run_dir=tmp_path / "run")
    assert run.run_dir == tmp_path / "run" and run.finished and run.stop_reason == "stop_reward"
    assert run.final_test_return >= 475 and run.best_test_return >= 475
    policy = rlcli.load(run.run_dir, load="best")
    envs = policy.make_env(num_envs=4)
    obs, _ = envs.reset(seed=0)
    action, state = policy.predict(obs)  # a batch in, a batch out
    assert action.shape == (4,) and state is None and envs.single_action_space.contains(action[0])
    single, _ = policy.predict(obs[0])
    assert single.shape == () and single == action[0]
    envs.close()
    evaluation = rlcli.evaluate(policy, episodes=5)
    assert len(evaluation.returns) == 5 and evaluation.lengths == [int(r) for r in evaluation.returns]
    assert evaluation.mean_return >= 475
    # the same numbers as rl-eval's for the same checkpoint and seed
    out = forked_cli.run([str(run.run_dir), "episodes=5"], tmp_path, timeout=300, program="rl-eval")
    assert out.returncode == 0, out.stderr
    assert json.loads((run.run_dir / "eval" / "best.json").read_text())["returns"] == evaluation.returns
    path = rlcli.export(policy, "torchscript")
    assert path == run.run_dir / "export" / "best.pt" and path.with_suffix(".json").is_file()
    # recording changes nothing: the episode is the one evaluate plays unrecorded. (Not evaluation's first: that one
    # was acted on in a batch of 5 envs, and a batch's matrix products may round differently from one env's; on an
    # AVX-512 CPU that flipped a near-tie action here, 372 against 500.)
    watched = rlcli.evaluate(policy, episodes=1, video=True, video_format="gif")
    unrecorded = rlcli.evaluate(policy, episodes=1)
    assert watched.returns == unrecorded.returns and len(watched.videos) == 1 and watched.videos[0].is_file()


class StopAt(rlcli.Callback):
    """Logs a scalar of its own after every update; asks to stop once the run reaches `steps`."""

    def __init__(self, steps):
        self.steps, self.seen = steps, []

    def on_start(self, run):
        self.seen.append(("start", run.env_steps))

    def after_update(self, run, metrics):
        run.log("custom/policy_loss", float(metrics["policy_loss"]))
        return "enough" if run.env_steps >= self.steps else None

    def after_test(self, run, result):
        self.seen.append(("test", run.env_steps, len(result.returns)))

    def on_checkpoint(self, run, path):
        self.seen.append(("checkpoint", path.name))

    def on_end(self, run, reason):
        self.seen.append(("end", reason))


def test_a_callback_logs_and_stops_the_run_which_resumes_to_the_end(tmp_path, capsys):
    callback = StopAt(1024)
    run = rlcli.train(["algo=ppo", "env=CartPole-v1"], train=TINY, log=QUIET, run_dir=tmp_path / "run",
                      callbacks=[callback])
    assert (run.env_steps, run.stop_reason, run.finished) == (1024, "enough", False)
    assert callback.seen == [("start", 0), ("test", 1024, 2), ("checkpoint", "ckpt_000000001024.pt"),
                             ("end", "enough")]
    # the run directory is rl-train's: config, overrides, checkpoints, test records, TensorBoard
    assert (run.run_dir / ".hydra" / "config.yaml").is_file() and (run.run_dir / "train.log").is_file()
    events = EventAccumulator(str(run.run_dir / "tb"))
    events.Reload()
    assert [p.step for p in events.Scalars("custom/policy_loss")][:2] == [256, 512]
    resumed = rlcli.train(resume="auto", run_dir=run.run_dir, log=QUIET)  # a second run in the same process
    assert (resumed.env_steps, resumed.stop_reason, resumed.finished) == (2048, "budget", True)
    records = [json.loads(line)["env_steps"] for line in (run.run_dir / "eval.jsonl").read_text().splitlines()]
    assert records == [1024, 2048]
    assert resumed.agent.checkpoint.name == "ckpt_000000002048.pt"
    assert rlcli.train(resume=run.run_dir, log=QUIET).stop_reason == "already finished"
    # its line in Python's words: more_steps=, run_dir=
    out = capsys.readouterr()
    assert "rlcli.train: this run already finished at 2,048 env steps" in out.err + out.out
    assert "give more_steps=<n> (nothing was changed)" in out.err + out.out
    with pytest.raises(rlcli.RlcliError, match=f"^run_dir={re.escape(str(run.run_dir))} already holds a trained run"):
        rlcli.train(algo="ppo", env="CartPole-v1", run_dir=run.run_dir, log=QUIET)


def test_ctrl_c_in_python_saves_a_checkpoint_and_raises_keyboard_interrupt(tmp_path):
    class Interrupt(rlcli.Callback):
        def after_update(self, run, metrics):
            if run.env_steps == 512:
                os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C in a notebook sends

    # a notebook's Python has the default handler; a test started in the background (`cmd &`) inherits SIGINT
    # ignored instead, so set the notebook's here and give the inherited one back at the end
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt, match="checkpoint saved"):
            rlcli.train(algo="ppo", train=TINY, log=QUIET, run_dir=tmp_path / "run", callbacks=[Interrupt()])
        assert [p.name for p in (tmp_path / "run" / "checkpoints").glob("ckpt_*.pt")] == ["ckpt_000000000512.pt"]
        assert rlcli.train(resume=tmp_path / "run", log=QUIET).env_steps == 2048
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handlers are given back
    finally:
        signal.signal(signal.SIGINT, inherited)


def test_bad_input_is_one_line_rlcli_error_not_system_exit(tmp_path):
    cases = [
        (dict(algo="ppoo"), "unknown algo 'ppoo' (did you mean 'ppo'?)"),
        (dict(train={"total_steps": -1}), "train.total_steps=-1 is invalid"),
        (dict(overrides=["--cfg", "job"]), "'--cfg' is a command-line flag"),
        (dict(env=object()), "is neither an env name"),  # an env instance or a VectorEnv is accepted since #56
        (dict(env="NoSuchEnv-v0"), "NoSuchEnv-v0"),
        (dict(callbacks=[lambda run: None]), "rlcli.Callback instances"),
        (dict(resume=tmp_path / "nowhere"), "nowhere"),
    ]
    for kwargs, message in cases:
        overrides = kwargs.pop("overrides", None)
        with pytest.raises((rlcli.RlcliError, TypeError)) as error:
            rlcli.train(overrides, run_dir=tmp_path / "run", log=QUIET, **kwargs)
        assert message in str(error.value) and "\n" not in str(error.value), (kwargs, str(error.value))
    assert not (tmp_path / "run").exists()  # nothing was made for bad input
    with pytest.raises(rlcli.RlcliError, match="no such run directory or checkpoint file"):
        rlcli.load(tmp_path / "nowhere")


def test_a_diverging_run_raises_rlcli_error_naming_the_last_good_checkpoint(tmp_path):
    with pytest.raises(rlcli.RlcliError, match="non-finite") as error:
        rlcli.train(["algo=ppo", "algo.schedules.lr=step:0.0003:1e30:0.5", "train.checkpoint_every=1024"],
                    train={"total_steps": 4096, "test_every": 0}, log=QUIET, run_dir=tmp_path / "run")
    assert "the last good checkpoint is checkpoints/ckpt_" in str(error.value) and "\n" not in str(error.value)


class Corridor(gym.Env):
    """Walk right to the goal at cell 4: an env a user writes in a notebook and never registers."""

    observation_space = gym.spaces.Box(0.0, 4.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length=4):
        self.length = length

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position, self.t = 0, 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.position = max(0, self.position + (1 if action == 1 else -1))
        self.t += 1
        done = self.position >= self.length
        return np.array([self.position], np.float32), float(done), done, self.t >= 20, {}


def make_corridor():
    return Corridor(length=4)


def test_train_on_an_env_made_by_a_python_function_then_resume_it_from_python_only(tmp_path):
    callback = StopAt(1024)
    run = rlcli.train("algo=ppo algo.n_steps=32 algo.batch_size=64", env=make_corridor, seed=2,
                      train={**TINY, "stop_reward": None}, log=QUIET,
                      run_dir=tmp_path / "run", callbacks=[callback])
    assert run.env_steps == 1024 and not run.finished
    config = (run.run_dir / ".hydra" / "config.yaml").read_text()
    assert "id: rlcli-python/make_corridor-v0" in config
    shell = subprocess.run([os.path.join(os.path.dirname(sys.executable), "rl-train"), f"resume={run.run_dir}"],
                           capture_output=True, text=True, timeout=300)
    assert shell.returncode == 2 and "rlcli-python/make_corridor-v0" in shell.stderr, shell.stderr
    assert len(shell.stderr.strip().splitlines()) == 1
    resumed = rlcli.train(env=make_corridor, resume=run.run_dir, log=QUIET)
    assert resumed.env_steps == 2048 and resumed.finished
    action, _ = resumed.agent.predict(np.array([1.0], np.float32))
    assert action in (0, 1)
    with pytest.raises(rlcli.RlcliError, match=r"obs of shape \(3,\)"):
        resumed.agent.predict(np.zeros(3, np.float32))


def test_a_recurrent_policy_takes_and_returns_its_state(tmp_path):
    run = rlcli.train(algo="ppo", actor="lstm", env="CartPoleNoVel-v1", train=TINY, log=QUIET,
                      run_dir=tmp_path / "run")
    policy = run.load("last")
    assert policy.recurrent
    obs = np.zeros((3, 2), np.float32)
    action, state = policy.predict(obs)
    assert action.shape == (3,) and state.shape[0] == 3
    again, state2 = policy.predict(obs, state=state, episode_start=np.zeros(3, bool))
    fresh, state3 = policy.predict(obs, state=state, episode_start=np.ones(3, bool))
    np.testing.assert_allclose(state3, state)  # a new episode starts from a zero carry, as state=None does
    assert not np.allclose(state2, state)


def test_every_public_name_has_a_docstring_and_type_hints():
    assert set(rlcli.__all__) <= set(dir(rlcli))
    for name in rlcli.__all__:
        if name == "__version__":
            continue
        obj = getattr(rlcli, name)
        assert inspect.getdoc(obj), f"rlcli.{name} has no docstring"
        functions = [obj] if inspect.isfunction(obj) else [
            member for attr, member in vars(obj).items()
            if not attr.startswith("_") and inspect.isfunction(member)]
        for function in functions:
            assert inspect.getdoc(function), f"rlcli.{name}: {function.__qualname__} has no docstring"
            hints = function.__annotations__  # strings (postponed annotations): torch is imported only when used
            parameters = [p for p in inspect.signature(function).parameters if p != "self"]
            missing = [p for p in [*parameters, "return"] if p not in hints and p not in ("args", "kwargs")]
            assert not missing, f"{function.__qualname__} lacks type hints for {missing}"
    assert "train(" in rlcli.__doc__ and "load(" in rlcli.__doc__  # help(rlcli) shows the way in


def test_a_refused_resume_from_python_leaves_the_run_directory_free_for_another_process(tmp_path):
    run = rlcli.train(algo="ppo", train=TINY, log=QUIET, run_dir=tmp_path / "run")
    with pytest.raises(rlcli.RlcliError, match="algo"):
        rlcli.train(resume=run.run_dir, algo={"n_epochs": 0})
    shell = subprocess.run([os.path.join(os.path.dirname(sys.executable), "rl-train"), f"resume={run.run_dir}",
                            "train.total_steps=3072", "log.console=false"], capture_output=True, text=True, timeout=300)
    assert shell.returncode == 0, shell.stderr  # not "in use by another rl-train"
