"""What a Stable-Baselines3 user reaches for in rlcli's Python API (issue 56, items 2 and 5): a run trained on a
Python env function, loaded and continued in a new process; save(path) / load(path); an env instance or a
VectorEnv; n more steps; policy_kwargs; an algorithm's settings as keywords; predict on raw observations."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import rlcli

TINY = {"total_steps": 512, "num_envs": 2, "test_every": 256, "test_episodes": 2, "log_every": 256}
QUIET = {"console": False, "tensorboard": False}
PPO = {"n_steps": 64, "batch_size": 64, "n_epochs": 2}
ENV_MODULE = '''
import gymnasium as gym

def make_cartpole():
    return gym.make("CartPole-v1")
'''


class StopAt(rlcli.Callback):
    """Stops the run (resumably) once it has `steps` env steps."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def after_update(self, run, stats):
        return "enough" if run.state.env_steps >= self.steps else None


def _python(script: str, cwd: Path) -> subprocess.CompletedProcess:
    """`script` in a fresh interpreter (a kernel restart): nothing of this process's registrations survives."""
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_an_sb3_users_script_train_save_load_in_a_new_process_predict_and_train_n_more(tmp_path):
    """SB3: model = PPO("MlpPolicy", env, n_steps=64); model.learn(n); model.save(p); PPO.load(p, env=env) in a
    new kernel; model.predict(obs); model.learn(n, reset_num_timesteps=False). The same in rlcli, on an env that a
    Python function makes (item 2: only that function can make it again, and every message says so)."""
    (tmp_path / "myenvs.py").write_text(ENV_MODULE)
    sys.path.insert(0, str(tmp_path))
    try:
        from myenvs import make_cartpole
    finally:
        sys.path.remove(str(tmp_path))
    run = rlcli.train(algo="ppo", env=make_cartpole, **PPO, learning_rate=1e-3, train=TINY, log={"tensorboard": False},
                      run_dir=tmp_path / "run", callbacks=[StopAt(256)])
    assert run.env_steps == 256 and not run.finished
    stop_line = [line for line in (run.run_dir / "train.log").read_text().splitlines() if "continue it with" in line]
    assert stop_line and f"rlcli.train(resume='{run.run_dir}', env=make_cartpole)" in stop_line[-1], stop_line
    saved = run.save(tmp_path / "ppo_cartpole")  # SB3's model.save: exactly the path given
    assert saved == tmp_path / "ppo_cartpole" and saved.is_file()

    out = _python(f"""
        import numpy as np, rlcli
        from myenvs import make_cartpole
        for call in (lambda: rlcli.load({str(run.run_dir)!r}), lambda: rlcli.load({str(saved)!r}),
                     lambda: rlcli.train(resume={str(run.run_dir)!r})):
            try:
                call()
            except rlcli.RlcliError as error:
                print("REFUSED", error)
        policy = rlcli.load({str(saved)!r}, env=make_cartpole)
        action, _ = policy.predict(np.zeros(4, np.float32))
        print("ACTION", int(action))
        again = rlcli.train(resume={str(run.run_dir)!r}, env=make_cartpole, more_steps=128, log={{"console": False}})
        print("STEPS", again.env_steps, again.finished)
    """, tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    refused = [line for line in out.stdout.splitlines() if line.startswith("REFUSED")]
    assert len(refused) == 3, out.stdout
    for line in refused:  # each says which call rebuilds the env: load(..., env=) to act, train(resume=, env=) to go on
        assert "rlcli.load(" in line and "env=make_cartpole)" in line and "rlcli.train(resume=" in line, line
        assert "not a registered gymnasium id" not in line
    assert f"rlcli.load({str(run.run_dir)!r}, env=make_cartpole)" in refused[0]
    assert f"rlcli.load({str(saved)!r}, env=make_cartpole)" in refused[1]
    assert "ACTION 0" in out.stdout or "ACTION 1" in out.stdout
    assert "STEPS 384 True" in out.stdout, out.stdout  # 256 + 128: n more steps, not a new absolute budget


def test_frozenlake_predict_takes_the_envs_integer_and_policy_kwargs_and_sb3_keywords_configure_the_run(tmp_path):
    run = rlcli.train(algo="ppo", env="FrozenLake-v1", n_steps=64, batch_size=64, n_epochs=2, learning_rate=1e-3,
                      policy_kwargs={"net_arch": {"pi": [32, 32], "vf": [32, 32]}, "activation_fn": torch.nn.ReLU},
                      train={**TINY, "test_every": 0}, log=QUIET, run_dir=tmp_path / "run")
    config = run.agent.config
    assert list(config.actor.hidden_sizes) == [32, 32] and config.actor.activation == "relu"
    assert config.algo.n_steps == 64 and config.algo.lr == 1e-3 and config.algo.name == "ppo"
    policy = run.agent
    single, state = policy.predict(5)  # FrozenLake's own observation: an int
    assert single.shape == () and state is None and 0 <= int(single) < 4
    batch, _ = policy.predict([0, 5, 15])
    assert batch.shape == (3,)
    one_hot = np.eye(16, dtype=np.float32)[[0, 5, 15]]  # rlcli's encoded observations still work
    np.testing.assert_array_equal(policy.predict(one_hot)[0], batch)
    with pytest.raises(ValueError, match=r"obs 16 is not a FrozenLake-v1 observation \(Discrete\(16\)\)"):
        policy.predict(16)
    loaded = rlcli.load(run.save(tmp_path / "agent.pt"))
    np.testing.assert_array_equal(loaded.predict([0, 5, 15])[0], batch)


class DictTask(gym.Env):
    """A Dict observation: a position and a one-bit flag; act 1 when the flag is set."""

    observation_space = gym.spaces.Dict({"position": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
                                         "flag": gym.spaces.Discrete(2)})
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        self.flag = int(self.np_random.integers(2))
        return {"position": self.np_random.uniform(-1, 1, 2).astype(np.float32), "flag": self.flag}

    def step(self, action):
        reward = float(action == self.flag)
        self.t += 1
        return self._obs(), reward, False, self.t >= 10, {}


def test_an_env_instance_trains_and_predict_takes_its_dict_observations(tmp_path):
    instance = DictTask()
    run = rlcli.train(algo="ppo", env=instance, **PPO, train={**TINY, "test_every": 0}, log=QUIET,
                      run_dir=tmp_path / "run")
    assert run.env_steps == 512
    policy = run.agent
    raw, _ = instance.reset(seed=3)
    action, _ = policy.predict(raw)  # one Dict observation, as the env gives it
    assert action.shape == ()
    batch = {"position": np.stack([raw["position"]] * 3), "flag": np.array([0, 1, raw["flag"]])}
    actions, _ = policy.predict(batch)
    assert actions.shape == (3,) and actions[2] == action
    envs = policy.make_env(num_envs=1)  # the flattened observations rlcli's envs give act the same
    flat, _ = envs.reset(seed=3)
    envs.close()
    np.testing.assert_array_equal(policy.predict(flat[0])[0], policy.predict(DictTask().reset(seed=3)[0])[0])
    with pytest.raises(ValueError, match="lacks the key"):
        policy.predict({"position": raw["position"]})
    assert len(rlcli.evaluate(policy, env=instance, episodes=2).returns) == 2


def test_a_vector_env_sets_the_id_and_num_envs(tmp_path):
    envs = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    run = rlcli.train(algo="ppo", env=envs, **PPO, train={"total_steps": 256, "test_every": 0}, log=QUIET,
                      run_dir=tmp_path / "run")
    envs.close()
    config = run.agent.config
    assert config.env.id == "CartPole-v1" and config.train.num_envs == 2  # resumable from the shell too
    assert len(rlcli.evaluate(run.agent, env=gym.make("CartPole-v1"), episodes=2).returns) == 2


def test_sb3_keyword_names_go_to_rlcli_keys_and_an_unknown_one_names_the_closest():
    from rlcli.entry.api_habits import algo_keywords

    mapped = algo_keywords({"algo": "sac", "learning_rate": 1e-3, "gamma": 0.98, "total_timesteps": 5000, "n_envs": 2,
                            "buffer_size": 1000, "train": {"num_envs": 4}, "seed": 3}, [])
    assert mapped == {"algo": {"name": "sac", "lr": 1e-3, "gamma": 0.98}, "seed": 3,
                      "train": {"num_envs": 4, "total_steps": 5000}, "buffer": {"capacity": 1000}}  # train= wins
    assert algo_keywords({"n_steps": 64}, ["algo=a2c"]) == {"algo": {"n_steps": 64}}  # the overrides' algo
    for kwargs, said in ((dict(n_stepz=64), "n_stepz=64 is neither a setting nor a key of algo=ppo's config (did you "
                                            "mean 'n_steps'?)"),
                         (dict(verbose=0), "(SB3's verbose is log.console here)")):
        with pytest.raises(ValueError) as error:
            rlcli.train(algo="ppo", log=QUIET, **kwargs)
        assert said in str(error.value) and "\n" not in str(error.value)


class Uncopyable(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __deepcopy__(self, memo):
        raise TypeError("holds a socket")


@pytest.mark.parametrize(("kwargs", "kind", "message"), [
    (dict(more_steps=100), ValueError, "more_steps=100 continues a run: give resume=<run dir> too"),
    (dict(more_steps=0, resume="x"), ValueError, "more_steps=0 is invalid: must be >= 1"),
    (dict(more_steps=1.5, resume="x"), TypeError, "more_steps=1.5 must be an int"),
    (dict(more_steps=10, resume="x", train={"total_steps": 10}), ValueError, "give one of them"),
    (dict(more_steps=10, resume="nowhere"), FileNotFoundError, "resume='nowhere': no such run directory"),
    (dict(policy_kwargs={"net_arch": {"pi": [64], "vf": [32]}}), ValueError, "the same hidden sizes"),
    (dict(policy_kwargs={"activation_fn": torch.nn.Sigmoid}), ValueError, "activation_fn=<class"),
    (dict(policy_kwargs={"features_extractor_class": object}), ValueError, "'features_extractor_class' has no rlcli"),
    (dict(policy_kwargs=[64, 64]), TypeError, "policy_kwargs=[64, 64] must be a dict"),
    (dict(env=Uncopyable()), TypeError, "env=Uncopyable(...) is an env instance that cannot be copied"),
])
def test_bad_sb3_style_arguments_are_one_line_errors_before_anything_runs(tmp_path, kwargs, kind, message):
    with pytest.raises(kind) as error:
        rlcli.train(run_dir=tmp_path / "run", log=QUIET, **kwargs)
    assert isinstance(error.value, rlcli.RlcliError) and message in str(error.value)
    assert "\n" not in str(error.value) and not (tmp_path / "run").exists()


def test_the_guide_shows_sb3_beside_rlcli_and_says_where_the_defaults_differ():
    guide = (Path(__file__).parents[1] / "docs" / "guide" / "python.md").read_text()
    for text in ("model.save(", "run.save(", "reset_num_timesteps=False", "more_steps=", "policy_kwargs",
                 "deterministic=True", "deterministic=False", "env=make_env)"):
        assert text in guide, text
    assert "returns False" in guide and "returning True" in guide  # SB3's _on_step stops on False, rlcli's on True


@pytest.mark.slow
def test_population_workers_one_per_core_need_no_joblib(tmp_path):
    """Item 8: the population launcher's own worker processes (n_jobs=2) run where joblib cannot be imported (the
    base install, after `make train`); before, n_jobs=2 was refused and n_jobs=auto trained in one process."""
    shim = tmp_path / "shim" / "joblib"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text('raise ImportError("no joblib in this install")\n')
    rl_train = Path(sys.executable).parent / "rl-train"
    out = subprocess.run([str(rl_train), "-m", "algo=ppo", "algo.n_steps=32", "algo.batch_size=64", "algo.n_epochs=2",
                          "train.num_envs=2", "train.total_steps=256", "train.test_every=128", "train.test_episodes=2",
                          "seed=0,1", "hydra/launcher=population", "hydra.launcher.n_jobs=2", "hydra.sweep.dir=sweep",
                          "log.tensorboard=false"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(tmp_path / "shim")})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "need joblib" not in out.stderr
    for job in "01":
        log = (tmp_path / "sweep" / job / "train.log").read_text()
        assert "done: 256 env steps" in log


def test_overrides_given_as_a_dict_are_the_same_overrides():
    """rlcli.train({"algo": "sac", "train.total_steps": 256}): it read the dict's keys alone ("'train.total_steps' is
    not a key=value argument")."""
    from rlcli.entry.api import _as_list

    assert _as_list({"algo": "sac", "train.total_steps": 256, "env": {"normalize_obs": True}}) == \
        ["algo=sac", "train.total_steps=256", "env.normalize_obs=true"]
    assert _as_list("algo=sac train.total_steps=256") == _as_list(["algo=sac", "train.total_steps=256"])
