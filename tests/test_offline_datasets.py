"""Offline datasets (#57, item 1): made, written in Minari's format and as .npz, read back bit-identical (by rlcli
and by minari itself), D4RL-style HDF5 and DataCollector-written datasets read, bad datasets refused in one line,
and `rl-dataset` as a user runs it."""

import os
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest

from rlcli.entry.dataset_making import (
    _insertion_order,
    concat,
    episodes_from_chains,
    make_from_buffer,
    make_from_run,
    make_random,
    parse_noise,
    summarize,
)
from rlcli.offline.checks import check_against_env, check_dataset
from rlcli.offline.dataset import Dataset
from rlcli.offline.load import load_dataset
from rlcli.offline.save import save_minari, save_npz
from rlcli.registry import ConfigError

minari = pytest.importorskip("minari")
h5py = pytest.importorskip("h5py")

FIELDS = ("observations", "actions", "rewards", "next_observations", "terminations", "truncations")
RL_DATASET = os.path.join(os.path.dirname(sys.executable), "rl-dataset")


def same(a: Dataset, b: Dataset) -> None:
    for field in FIELDS:
        x, y = getattr(a, field), getattr(b, field)
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), field


@pytest.fixture(scope="module")
def pendulum() -> Dataset:
    dataset = make_random("Pendulum-v1", 450, seed=3)  # two whole episodes and a cut one
    dataset.ref_min_score, dataset.ref_max_score = -1200.0, -150.0
    return dataset


@pytest.fixture
def root(tmp_path, monkeypatch):
    where = tmp_path / "minari"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(where))
    return where


def test_random_dataset_shape(pendulum):
    assert len(pendulum) == 450 and pendulum.env_id == "Pendulum-v1"
    assert pendulum.observations.dtype == np.float32 and pendulum.actions.shape == (450, 1)
    assert pendulum.actions.dtype == np.float32 and pendulum.rewards.dtype == np.float32
    assert list(pendulum.episode_ends) == [199, 399, 449]
    assert pendulum.truncations[[199, 399, 449]].all() and not pendulum.terminations.any()
    assert (pendulum.next_observations[:199] == pendulum.observations[1:200]).all()


def test_minari_round_trip_is_bit_identical_for_rlcli_and_minari(pendulum, root):
    path = save_minari(pendulum, "pendulum/random-v0")
    assert path == root / "pendulum" / "random-v0"
    for source in ("pendulum/random-v0", str(path)):  # by id under the root, and by directory
        back = load_dataset(source)
        same(pendulum, back)
        assert (back.env_id, back.ref_min_score, back.ref_max_score) == ("Pendulum-v1", -1200.0, -150.0)
        assert back.name == "pendulum/random-v0" and back.metadata["source"] == "random"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = minari.load_dataset("pendulum/random-v0")
    assert theirs.spec.env_spec.id == "Pendulum-v1" and theirs.total_steps == 450 and theirs.total_episodes == 3
    assert theirs.storage.metadata["ref_min_score"] == -1200.0 and theirs.storage.metadata["ref_max_score"] == -150.0
    episodes = list(theirs.iterate_episodes())
    assert np.array_equal(np.concatenate([e.observations[:-1] for e in episodes]), pendulum.observations)
    assert np.array_equal(np.concatenate([e.observations[1:] for e in episodes]), pendulum.next_observations)
    assert np.array_equal(np.concatenate([e.actions for e in episodes]), pendulum.actions)
    with pytest.raises(ConfigError, match="exists already"):
        save_minari(pendulum, "pendulum/random-v0")
    save_minari(pendulum, "pendulum/random-v0", overwrite=True)
    with pytest.raises(ConfigError, match="name-v<N>"):
        save_minari(pendulum, "no-version")


def test_npz_round_trip(pendulum, tmp_path):
    path = save_npz(pendulum, tmp_path / "p.npz")
    back = load_dataset(path)
    same(pendulum, back)
    assert (back.env_id, back.ref_min_score, back.ref_max_score, back.name) == \
        ("Pendulum-v1", -1200.0, -150.0, pendulum.name)
    with pytest.raises(ConfigError, match="exists already"):
        save_npz(pendulum, path)


def test_d4rl_style_hdf5_with_and_without_next_observations(pendulum, tmp_path):
    with_next = tmp_path / "with.hdf5"
    with h5py.File(with_next, "w") as f:
        f.attrs["env_name"] = "Pendulum-v1"
        f.attrs["ref_min_score"] = -1200.0
        for key, field in (("observations", "observations"), ("actions", "actions"), ("rewards", "rewards"),
                           ("next_observations", "next_observations"), ("terminals", "terminations"),
                           ("timeouts", "truncations")):
            f[key] = getattr(pendulum, field)
        f["infos/qpos"] = np.zeros((len(pendulum), 2))  # D4RL's extra groups are skipped
    back = load_dataset(with_next)
    same(pendulum, back)
    assert back.env_id == "Pendulum-v1" and back.ref_min_score == -1200.0 and back.ref_max_score is None
    # D4RL's raw files: no next_observations, flags as float, an episode that terminates at row 9
    raw = tmp_path / "raw.h5"
    terminals = np.zeros(450)
    terminals[9] = 1.0
    with h5py.File(raw, "w") as f:
        f["observations"], f["actions"] = pendulum.observations, pendulum.actions.astype(np.float64)
        f["rewards"], f["terminals"], f["timeouts"] = pendulum.rewards, terminals, pendulum.truncations.astype(float)
    derived = load_dataset(raw)
    # the truncated last steps (rows 199, 399, 449) are dropped, the steps before them truncate
    keep = np.setdiff1d(np.arange(450), [199, 399, 449])
    assert len(derived) == 447 and derived.actions.dtype == np.float32
    assert np.array_equal(derived.observations, pendulum.observations[keep])
    assert np.array_equal(derived.next_observations[:9], pendulum.observations[1:10])
    assert derived.terminations[9] and list(np.flatnonzero(derived.truncations)) == [198, 397, 446]
    assert np.array_equal(derived.next_observations[10:199], pendulum.next_observations[10:199])
    assert "dropped" in str(derived.metadata["next_observations"])


def test_data_collector_dataset_is_read(root):
    pytest.importorskip("jax")  # Minari's DataCollector needs it (minari[create])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = minari.DataCollector(gym.make("CartPole-v1"))
        env.action_space.seed(0)
        obs, _ = env.reset(seed=0)
        for _ in range(120):
            obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                env.reset()
        env.create_dataset("cartpole/someone-v0", algorithm_name="random", ref_min_score=10.0, ref_max_score=500.0)
        env.close()
        theirs = minari.load_dataset("cartpole/someone-v0")
        episodes = list(theirs.iterate_episodes())
    ours = load_dataset("cartpole/someone-v0")
    assert len(ours) == theirs.total_steps and ours.env_id == "CartPole-v1"
    assert ours.actions.dtype == np.int64 and ours.actions.ndim == 1
    assert (ours.ref_min_score, ours.ref_max_score) == (10.0, 500.0)
    assert np.array_equal(ours.observations, np.concatenate([e.observations[:-1] for e in episodes]))
    assert np.array_equal(ours.terminations, np.concatenate([e.terminations for e in episodes]))
    assert summarize(ours).episodes == len(episodes)
    check_against_env(ours, gym.make("CartPole-v1").observation_space, gym.make("CartPole-v1").action_space)


def test_an_id_not_in_the_local_root_is_one_line(root):
    with pytest.raises(ConfigError) as error:
        load_dataset("D4RL/door/human-v2")
    message = str(error.value)
    assert "not in the local Minari root" in message and "cannot download" in message and "\n" not in message
    with pytest.raises(ConfigError, match="does not exist"):
        load_dataset(str(root / "missing.npz"))


def test_a_failed_download_is_one_line(root, monkeypatch):
    def no_network(dataset_id, force_download=False):
        raise OSError("[Errno 101] Network is unreachable\n  during handshake")

    monkeypatch.setattr(minari, "download_dataset", no_network)
    with pytest.raises(ConfigError) as error:
        load_dataset("D4RL/door/human-v2", download=True)
    assert str(error.value) == ("dataset 'D4RL/door/human-v2' is not in the local Minari root "
                                f"{root} and could not be downloaded (OSError: [Errno 101] Network is unreachable)")


def test_minari_missing_says_how_to_install(monkeypatch, pendulum, tmp_path):
    monkeypatch.setitem(sys.modules, "minari", None)
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[offline\]'"):
        save_minari(pendulum, "x/y-v0", root=tmp_path)


def _bad(pendulum: Dataset, **changes) -> Dataset:
    arrays = {f: getattr(pendulum, f).copy() for f in FIELDS}
    for key, change in changes.items():
        arrays[key] = change(arrays[key])
    return Dataset(**arrays, name="bad")


def _set(row, value):
    def change(a):
        a = a.astype(type(value)) if isinstance(value, int) and not isinstance(value, bool) else a
        a[row] = value
        return a
    return change


BAD = {
    "nan reward": ({"rewards": _set(5, np.nan)}, "rewards holds nan at row 5"),
    "inf observation": ({"observations": _set((7, 1), np.inf)}, "observations holds inf at row 7 index [1]"),
    "short actions": ({"actions": lambda a: a[:-1]}, "actions has 449 rows, expected 450"),
    "next obs shape": ({"next_observations": lambda a: a[:, :2]}, "next_observations has shape (450, 2)"),
    "flag not boolean": ({"terminations": _set(3, 2)}, "terminations holds 2 at row 3, expected a boolean"),
    "both flags": ({"terminations": _set(199, True)}, "terminations and truncations are both true at row 199"),
    "empty": ({f: (lambda a: a[:0]) for f in FIELDS}, "is empty"),
    "text actions": ({"actions": lambda a: a.astype(str)}, "actions has dtype <U"),
    "2-d rewards": ({"rewards": lambda a: a[:, None]}, "rewards has shape (450, 1), expected (450,)"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_datasets_are_one_line(pendulum, case):
    changes, expected = BAD[case]
    with pytest.raises(ConfigError) as error:
        check_dataset(_bad(pendulum, **changes))
    assert expected in str(error.value) and "'bad'" in str(error.value) and "\n" not in str(error.value)


ENV_BAD = {
    "out of bounds": ("Pendulum-v1", {"actions": _set(4, 2.5)}, "actions hold 2.5 at row 4 index [0], expected within"),
    "obs shape": ("MountainCarContinuous-v0", {}, "observations have shape (3,) per row, expected (2,)"),
    "discrete in range": ("CartPole-v1", {}, "actions have dtype float32"),
}


@pytest.mark.parametrize("case", ENV_BAD, ids=list(ENV_BAD))
def test_a_dataset_that_does_not_fit_its_env_is_one_line(pendulum, case):
    env_id, changes, expected = ENV_BAD[case]
    env = gym.make(env_id)
    dataset = _bad(pendulum, **changes)
    if env_id == "CartPole-v1":
        dataset.observations = dataset.next_observations = np.zeros((450, 4), np.float32)
    with pytest.raises(ConfigError) as error:
        check_against_env(dataset, env.observation_space, env.action_space)
    assert expected in str(error.value) and "\n" not in str(error.value)
    # a Discrete action out of range
    cart = gym.make("CartPole-v1")
    discrete = Dataset(np.zeros((3, 4), np.float32), np.array([0, 1, 2]), np.zeros(3, np.float32),
                       np.zeros((3, 4), np.float32), np.zeros(3, bool), np.ones(3, bool), name="d")
    with pytest.raises(ConfigError, match=r"actions hold 2 at row 2, expected an integer in \[0, 1\]"):
        check_against_env(discrete, cart.observation_space, cart.action_space)


def test_noise_specs():
    assert str(parse_noise("gaussian:0.1")) == "gaussian:0.1" and parse_noise("epsilon:1").scale == 1.0
    for spec in ("gauss:0.1", "epsilon:2", "gaussian:x", "gaussian:-1", "gaussian"):
        with pytest.raises(ConfigError, match="is invalid"):
            parse_noise(spec)


def test_episodes_of_interleaved_envs_are_chained():
    # two envs stepping together: env 0 visits 0, 1, 2, 3 (time limit), env 1 visits 10, 11 (terminates), 12, 13
    obs = np.array([[0], [10], [1], [11], [2], [12]], np.float32)
    nxt = np.array([[1], [11], [2], [99], [3], [13]], np.float32)
    terminated = np.array([False, False, False, True, False, False])
    order, terminations, truncations = episodes_from_chains(obs, nxt, terminated, num_envs=2)
    assert order.tolist() == [0, 2, 4, 1, 3, 5]
    assert terminations.tolist() == [False, False, False, False, True, False]
    assert truncations.tolist() == [False, False, True, False, False, True]
    # a full ring's oldest slot is where the next write goes
    assert _insertion_order(5, 2, capacity=5).tolist() == [2, 3, 4, 0, 1]
    assert _insertion_order(3, 3, capacity=5).tolist() == [0, 1, 2]


def test_concat_is_medium_expert(pendulum):
    other = make_random("Pendulum-v1", 50, seed=9)
    other.ref_min_score, other.ref_max_score = -1300.0, -100.0
    joined = concat([pendulum, other])
    assert len(joined) == 500 and joined.truncations[449] and joined.truncations[499]
    assert (joined.ref_min_score, joined.ref_max_score) == (-1300.0, -100.0)
    with pytest.raises(ConfigError, match="env_id is CartPole-v1, expected Pendulum-v1"):
        concat([pendulum, make_random("CartPole-v1", 10)])


# ------------------------------------------------------------------------------------------------ a trained run
@pytest.fixture(scope="module")
def sac_run(tmp_path_factory):
    import rlcli

    run = rlcli.train(algo={"name": "sac", "learning_starts": 100, "batch_size": 32}, env="Pendulum-v1", seed=0,
                      train={"total_steps": 400, "num_envs": 2, "test_every": 400, "test_episodes": 1,
                             "log_every": 400}, log={"console": False},
                      run_dir=tmp_path_factory.mktemp("sac") / "run")
    return run.run_dir


@pytest.mark.slow
def test_from_run_and_from_buffer(sac_run, root):
    dataset, policy = make_from_run(sac_run, 250, noise=parse_noise("gaussian:0.2"), seed=1)
    assert len(dataset) == 250 and dataset.env_id == "Pendulum-v1" and policy.algo_name == "sac"
    assert dataset.metadata["noise"] == "gaussian:0.2" and np.abs(dataset.actions).max() <= 2.0
    again, _ = make_from_run(sac_run, 250, noise=parse_noise("gaussian:0.2"), seed=1)
    same(dataset, again)  # the seed fixes the env, the policy's draws and the noise
    deterministic, _ = make_from_run(sac_run, 50, deterministic=True, seed=1)
    assert np.array_equal(deterministic.actions, np.stack([policy.predict(o)[0] for o in deterministic.observations]))

    replay, _ = make_from_buffer(sac_run)
    # 2 envs x 200 steps: every transition, regrouped into the two envs' episodes, actions as the env took them
    assert len(replay) == 400 and list(replay.episode_ends) == [199, 399] and replay.truncations.sum() == 2
    assert (replay.next_observations[:199] == replay.observations[1:200]).all()
    assert np.abs(replay.actions).max() > 1.0 and np.abs(replay.actions).max() <= 2.0  # [-2, 2], not SAC's [-1, 1]
    save_minari(replay, "pendulum/replay-v0")
    same(replay, load_dataset("pendulum/replay-v0"))


# ------------------------------------------------------------------------------------------------ the command
def rl_dataset(*args: str, cwd, env) -> subprocess.CompletedProcess:
    return subprocess.run([RL_DATASET, *args], capture_output=True, text=True, timeout=120, cwd=cwd, env=env)


@pytest.mark.slow
def test_rl_dataset_make_info_concat_and_errors(tmp_path):
    env = {**os.environ, "MINARI_DATASETS_PATH": str(tmp_path / "minari")}
    made = rl_dataset("make", "--random", "--env", "Pendulum-v1", "--steps", "300", "--out", "pendulum/random-v0",
                      "--ref-max-score", "-150", cwd=tmp_path, env=env)
    assert made.returncode == 0, made.stderr
    assert "wrote pendulum/random-v0" in made.stdout and "300 transitions, 2 episodes" in made.stdout
    assert "ref_min_score" in made.stdout and "random policy's mean return over 10 episodes" in made.stdout
    assert "ref_max_score -150.00 (given)" in made.stdout and "\x1b" not in made.stdout  # piped: no progress bar
    made = rl_dataset("make", "--random", "--env", "Pendulum-v1", "--steps", "100", "--seed", "1", "--out", "b.npz",
                      "--ref-min-score", "-1300", cwd=tmp_path, env=env)
    assert made.returncode == 0, made.stderr
    joined = rl_dataset("concat", "pendulum/random-v0", "b.npz", "--out", "pendulum/mixed-v0", cwd=tmp_path, env=env)
    assert joined.returncode == 0, joined.stderr
    assert "400 transitions, 3 episodes" in joined.stdout
    assert "ref_min_score -1300.00 (the parts' lowest)" in joined.stdout
    info = rl_dataset("info", "pendulum/mixed-v0", cwd=tmp_path, env=env)
    assert info.returncode == 0, info.stderr
    assert "transitions  400" in info.stdout and "episodes     3" in info.stdout and "Pendulum-v1" in info.stdout
    assert "ref scores   min -1300.00, max -150.00" in info.stdout
    for bad, expected in ((["make", "--random", "--env", "Pendulm-v1", "--steps", "5", "--out", "x.npz"],
                           "did you mean 'Pendulum-v1'"),
                          (["make", "--random", "--env", "Pendulum-v1", "--steps", "5", "--out", "b.npz"],
                           "exists already"),
                          (["make", "--from-run", "no/such/run", "--steps", "5", "--out", "x.npz"],
                           "no such run directory"),
                          (["make", "--random", "--env", "Pendulum-v1", "--steps", "5", "--noise", "pink:1", "--out",
                            "x.npz"], "noise 'pink:1' is invalid"),
                          (["info", "nowhere/none-v0"], "cannot download"),
                          (["frobnicate"], "invalid choice")):
        out = rl_dataset(*bad, cwd=tmp_path, env=env)
        assert out.returncode == 2 and out.stdout == "", (bad, out.stdout, out.stderr)
        assert out.stderr.count("\n") == 1 and out.stderr.startswith("rl-dataset: error: ") and expected in out.stderr
    assert not (tmp_path / "x.npz").exists()
