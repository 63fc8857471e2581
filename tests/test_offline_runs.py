"""Offline runs (`rl-train algo=... dataset=...`): the dataset in the replay storage, gradient steps on the run's
clock, test phases in the dataset's env, checkpoints that name the dataset instead of copying it, exact resume,
normalized scores, and one-line errors for a missing, bad or mismatched dataset."""

import json
import signal
import subprocess
import time
from pathlib import Path

import forked_cli
import numpy as np
import pytest
from offline_fixtures import PENDULUM_EXPERT_RETURN, PENDULUM_RANDOM_RETURN, pendulum_dataset
from test_resume import assert_same_run, final, scalars, wait_for_checkpoint

from rlcli.contracts import AlgoSpec
from rlcli.offline.dataset import Dataset
from rlcli.registry import ConfigError

FIELDS = ("observations", "actions", "rewards", "next_observations", "terminations", "truncations")
# a tiny TD3+BC learning from the dataset
TINY = ["algo=td3_bc", "actor.hidden_sizes=[32,32]", "algo.batch_size=64", "train.test_episodes=2",
        "train.stop_reward=null", "log.console=false", "deterministic=true"]


def write_npz(path: Path, dataset: Dataset, env_id: bool = True) -> Path:
    """A dataset as a plain .npz with the Dataset's field names (and its env id and reference returns)."""
    extra = {"env_id": dataset.env_id, "ref_min_score": dataset.ref_min_score,
             "ref_max_score": dataset.ref_max_score} if env_id else {}
    np.savez(path, **{k: getattr(dataset, k) for k in FIELDS}, **extra)
    return path


@pytest.fixture(scope="module")
def npz(tmp_path_factory) -> Path:
    return write_npz(tmp_path_factory.mktemp("data") / "pendulum.npz", pendulum_dataset(1000, noise=0.3))


def rl(args: list[str], cwd: Path, program: str = "rl-train") -> subprocess.CompletedProcess:
    return forked_cli.run(args, cwd, timeout=300, program=program)


def one_line(out: subprocess.CompletedProcess) -> str:
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("rl-train: error: "), out.stderr
    return lines[0]


# ------------------------------------------------------------------------------------------- the parts, no run
def test_an_offline_algorithm_without_a_dataset_names_the_flag_and_rl_dataset():
    from omegaconf import OmegaConf

    from rlcli.run.build import offline_data

    cfg = OmegaConf.create({"dataset": None, "algo": {"name": "td3_bc"}})
    with pytest.raises(ConfigError, match=r"algo=td3_bc learns from a dataset only: give dataset=.*rl-dataset make"):
        offline_data(cfg, AlgoSpec(on_policy=False, offline=True), ray=False)
    assert offline_data(OmegaConf.create({"dataset": None, "algo": {"name": "sac"}}), AlgoSpec(on_policy=False),
                        ray=False) is None


def test_fingerprint_changes_with_any_value_and_reward_scale_is_iqls():
    from rlcli.run.offline import OfflineSettings, fingerprint, reward_multiplier

    data = pendulum_dataset(450)  # 200 + 200 + 50 steps: three episodes
    same = fingerprint(pendulum_dataset(450))
    assert fingerprint(data) == same and same["transitions"] == 450
    data.rewards[7] += 1e-3
    assert fingerprint(data) != same
    ends = data.episode_ends
    returns = np.add.reduceat(data.rewards.astype(np.float64), np.r_[0, ends[:-1] + 1])
    factor = reward_multiplier(data, OfflineSettings(reward_scale="returns", reward_factor=2.0))
    assert factor == pytest.approx(2.0 * 1000.0 / (returns.max() - returns.min()))
    assert reward_multiplier(data, OfflineSettings()) == 1.0
    with pytest.raises(ConfigError, match="offline.reward_scale"):
        OfflineSettings(reward_scale="iql")  # type: ignore[arg-type]


def test_the_env_comes_from_the_dataset_unless_typed(npz, tmp_path, monkeypatch):
    from rlcli.entry.rl_train import offline_env_args

    monkeypatch.chdir(npz.parent)  # a relative path is recorded absolute: a resume from elsewhere finds it
    assert offline_env_args([f"dataset={npz.name}"]) == [f"dataset='{npz}'", "env=Pendulum-v1"]

    assert offline_env_args(["algo=sac", f"dataset={npz}"])[-1] == "env=Pendulum-v1"  # conf/env/Pendulum-v1.yaml
    # added where dataset= is, not after a flag's value (`--cfg job env=...` was argparse's error)
    assert offline_env_args(["algo=iql", f"dataset={npz.name}", "--cfg", "job"]) == \
        ["algo=iql", f"dataset='{npz}'", "env=Pendulum-v1", "--cfg", "job"]
    assert offline_env_args(["algo=sac", f"dataset={npz}", "env=Pendulum-v1"]).count("env=Pendulum-v1") == 1
    data = pendulum_dataset(10)
    data.env_id = "PendulumLike-v9"  # an id without a conf/env/ file: env=gym env.id=<id>
    other = write_npz(tmp_path / "other.npz", data)
    assert offline_env_args([f"dataset={other}"])[-2:] == ["env=gym", "env.id=PendulumLike-v9"]
    bare = write_npz(tmp_path / "bare.npz", data, env_id=False)
    with pytest.raises(ConfigError, match=r"does not say which env .* give env="):
        offline_env_args([f"dataset={bare}"])


# ------------------------------------------------------------------------------------------ rl-train errors
@pytest.mark.slow
def test_bad_datasets_and_envs_are_one_line_and_leave_no_run_dir(npz, tmp_path):
    line = one_line(rl(["algo=td3_bc"], tmp_path))
    assert "algo=td3_bc learns from a dataset only: give dataset=" in line and "rl-dataset make" in line, line
    line = one_line(rl(["algo=sac", f"dataset={tmp_path / 'missing.npz'}"], tmp_path))
    assert "missing.npz" in line and "rl-dataset make" in line, line
    line = one_line(rl(["algo=sac", f"dataset={npz}", "env=CartPole-v1"], tmp_path))
    assert "recorded on env Pendulum-v1, not env.id=CartPole-v1" in line, line
    line = one_line(rl(["algo=ppo", f"dataset={npz}"], tmp_path))
    assert "algo=ppo is on-policy" in line and "sac" in line, line
    line = one_line(rl(["algo=sac", f"dataset={npz}", "offline.reward_scale=iql"], tmp_path))
    assert "offline.reward_scale" in line and "returns" in line, line
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------------------------ a whole run
@pytest.fixture(scope="module")
def offline_run(npz, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("offline")
    out = rl([*TINY, f"dataset={npz}", "train.total_steps=300", "train.test_every=100", "train.checkpoint_every=100",
              "offline.normalize_obs=true", f"hydra.run.dir={root / 'run'}"], root)
    assert out.returncode == 0, out.stderr
    return root / "run"


@pytest.mark.slow
def test_an_offline_run_counts_gradient_steps_and_logs_normalized_scores(offline_run, npz):
    log = (offline_run / "train.log").read_text()
    assert "td3_bc on Pendulum-v1, 300 gradient steps" in log and "dataset pendulum.npz (1,000 transitions)" in log
    assert "done: 300 gradient steps" in log
    records = [json.loads(line) for line in (offline_run / "eval.jsonl").open()]
    assert [r["env_steps"] for r in records] == [100, 200, 300]
    for record in records:
        mean = float(np.mean(record["returns"]))
        expected = 100 * (mean - PENDULUM_RANDOM_RETURN) / (PENDULUM_EXPERT_RETURN - PENDULUM_RANDOM_RETURN)
        assert record["normalized_score"] == pytest.approx(expected)
    series = scalars(offline_run)
    assert [s for s, _ in series["eval/normalized_score"]] == [100, 200, 300]
    assert series["train/value_loss"][-1][0] == 300 and "rollout/episodes" not in series  # x: gradient steps
    checkpoints = offline_run / "checkpoints"
    assert (checkpoints / "best.pt").is_file() and len(list(checkpoints.glob("ckpt_*.pt"))) == 3
    stored = final(offline_run)["buffer"]
    assert set(stored) == {"dataset"} and stored["dataset"]["source"] == str(npz)  # named, not copied
    assert stored["dataset"]["transitions"] == 1000
    assert (checkpoints / "ckpt_000000000300.pt").stat().st_size < 200_000  # 1,000 x 2 observations would be more
    # the frozen observation statistics are the dataset's, in the networks (so rl-eval and export use them)
    from rlcli.actors.weights import network_weights

    weights = network_weights(final(offline_run))
    obs = np.load(npz)["observations"].astype(np.float64)
    np.testing.assert_allclose(weights["normalizer.mean"].numpy(), obs.mean(0), rtol=1e-6, atol=1e-9)


@pytest.mark.slow
def test_rl_eval_and_rl_report_read_an_offline_run(offline_run):
    out = rl([str(offline_run), "episodes=2"], offline_run.parent, program="rl-eval")
    assert out.returncode == 0, out.stderr
    out = rl([str(offline_run)], offline_run.parent, program="rl-report")
    assert out.returncode == 0, out.stderr
    assert "score" in out.stdout, out.stdout


@pytest.mark.slow
def test_sigkill_then_resume_is_bit_identical_and_a_changed_dataset_is_refused(npz, tmp_path):
    args = [*TINY, f"dataset={npz}", "train.total_steps=600", "train.test_every=300", "train.checkpoint_every=50",
            "train.log_every=100"]
    straight = forked_cli.start([*args, f"hydra.run.dir={tmp_path / 'straight'}"], tmp_path)
    killed = tmp_path / "killed"
    proc = forked_cli.start([*args, f"hydra.run.dir={killed}"], tmp_path)
    wait_for_checkpoint(killed, proc)
    while not (killed / "checkpoints" / "ckpt_000000000150.pt").exists() and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    _, err = straight.communicate(timeout=300)
    assert straight.returncode == 0, err
    steps_at_kill = final(killed)["state"]["env_steps"]
    assert 0 < steps_at_kill < 600

    changed = tmp_path / "changed.npz"  # the same file name's contents changed
    data = dict(np.load(npz))
    data["rewards"] = data["rewards"] + np.float32(1.0)
    np.savez(changed, **data)
    moved = npz.with_name("pendulum-original.npz")
    npz.rename(moved)
    changed.rename(npz)
    try:
        refused = rl([f"resume={killed}"], tmp_path)
        assert "changed since it was saved (the same size, other contents)" in one_line(refused)
    finally:
        moved.rename(npz)
    resumed = rl([f"resume={killed}"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed at {steps_at_kill:,} gradient steps" in (killed / "train.log").read_text()
    assert_same_run(tmp_path / "straight", killed)


@pytest.mark.slow
def test_rlcli_train_takes_a_dataset(npz, tmp_path, monkeypatch):
    import rlcli

    monkeypatch.chdir(tmp_path)
    run = rlcli.train(TINY, dataset=str(npz), train={"total_steps": 100, "test_every": 100},
                      run_dir=tmp_path / "run")
    assert run.env_steps == 100 and run.final_test_return is not None
    assert json.loads((tmp_path / "run" / "eval.jsonl").read_text().splitlines()[-1])["normalized_score"] < 100


def test_rl_report_gives_the_normalized_score_mean_and_ci_over_seeds(tmp_path, capsys):
    """Three seeds of one offline configuration with known scores: last and best per run, mean +- the t-interval."""
    import yaml

    from rlcli.entry import rl_report

    finals, bests = [40.0, 50.0, 60.0], [70.0, 80.0, 90.0]
    for seed, (last, best) in enumerate(zip(finals, bests, strict=True)):
        run = tmp_path / f"run{seed}"
        (run / ".hydra").mkdir(parents=True)
        (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["algo=iql", "dataset=d.npz", f"seed={seed}"]))
        (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"seed": seed}))
        records = [{"env_steps": 100, "returns": [1.0], "normalized_score": best},
                   {"env_steps": 200, "returns": [0.5], "normalized_score": last}]
        (run / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (group,) = rl_report.group_runs(rl_report.find_runs([tmp_path]))
    row = rl_report.summarize(group)
    half = 4.303 * np.std(finals, ddof=1) / np.sqrt(3)
    assert row["final_score"] == pytest.approx((50.0, half)) and row["best_score"][0] == pytest.approx(80.0)
    rl_report.main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "final score" in out and f"50.0 ± {half:.1f}" in out and "gradient steps" in out


def test_offline_config_errors_come_before_torch_is_imported(npz):
    """A missing dataset, a bad offline setting and another env are one line before torch's ~2 s import."""
    import sys

    code = ("import sys\nfrom rlcli.entry import rl_train\n"
            f"for extra in (['dataset=/nonexistent/d.npz'], ['dataset={npz}', 'offline.reward_scale=x'],\n"
            f"              ['dataset={npz}', 'env=CartPole-v1']):\n"
            "    try:\n        rl_train.main(['algo=td3_bc', *extra])\n"
            "    except SystemExit as exit:\n        print(exit.code, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["2", "False"] * 3, out.stdout + out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 3 and all(line.startswith("rl-train: error: ") for line in lines), out.stderr
    assert "offline.reward_scale" in lines[1] and "recorded on env Pendulum-v1" in lines[2]


def test_the_envs_running_normalizations_are_refused_offline():
    from omegaconf import OmegaConf

    from rlcli.run.offline import check_env_settings

    with pytest.raises(ConfigError, match="use offline.normalize_obs=true"):
        check_env_settings(OmegaConf.create({"env": {"normalize_obs": True}}))
    with pytest.raises(ConfigError, match="use offline.reward_scale=returns"):
        check_env_settings(OmegaConf.create({"env": {"normalize_reward": True}}))
    check_env_settings(OmegaConf.create({"env": {"normalize_obs": False}}))


@pytest.mark.slow
def test_offline_to_online_resumes_bit_identically_across_the_switch(npz, tmp_path):
    """100 gradient steps offline, then 100 env steps online into the storage that mixes the dataset and the new
    experience (the dataset's share of each batch annealed from a half to a tenth over the online steps); SIGKILL
    after the switch, mid-episode; resume: the same run as an unbroken one (the env's state included)."""
    args = [*TINY, f"dataset={npz}", "train.total_steps=100", "offline.online_steps=100", "train.test_every=200",
            "offline.offline_fraction_final=0.1",
            "train.checkpoint_every=25", "train.log_every=50", "offline.reward_scale=returns"]
    straight = forked_cli.start([*args, f"hydra.run.dir={tmp_path / 'straight'}"], tmp_path)
    killed = tmp_path / "killed"
    proc = forked_cli.start([*args, f"hydra.run.dir={killed}"], tmp_path)
    wait_for_checkpoint(killed, proc)
    while not (killed / "checkpoints" / "ckpt_000000000150.pt").exists() and proc.poll() is None:
        time.sleep(0.01)  # then the newest good checkpoint is 125's or 150's, whichever "latest" names
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    _, err = straight.communicate(timeout=300)
    assert straight.returncode == 0, err
    assert 100 < final(killed)["state"]["env_steps"] < 200
    resumed = rl([f"resume={killed}"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_run(tmp_path / "straight", killed)
    end = final(killed)
    assert end["state"]["episodes"] == 0 and end["collector"]["reported"] == 100  # half a 200-step episode online
    assert end["buffer"]["online"]["size"] == 1000 + 100 and len(end["buffer"]["online"]["rewards"]) == 100


def test_a_resume_replays_dataset_only_as_a_plain_path_or_id():
    from rlcli.run.resume import REPLACED, ReplayContext, _groups, owned_roots, why_not_replayed

    context = ReplayContext(owned_roots(), _groups(), [], set(), False)
    for plain in ("dataset=/data/pendulum.npz", "dataset='/data/a b.npz'", "dataset=pendulum/medium-v0",
                  "dataset=null"):
        assert why_not_replayed(plain, context) is None, plain
    for code in ("dataset=${oc.env:HOME}", "dataset=${algo.lr}", "dataset=[a,b]", "dataset={a: 1}"):
        assert "not a plain path or id" in str(why_not_replayed(code, context)) or "resolver" in str(
            why_not_replayed(code, context)), code
    again = ReplayContext(owned_roots(), _groups(), [], {"dataset"}, False)
    assert why_not_replayed("dataset=${algo.lr}", again) == REPLACED


def test_mixed_replay_draws_the_offline_fraction_and_keeps_only_online_rows():
    import gymnasium as gym
    import torch
    from offline_fixtures import dataset_replay

    from rlcli.offline.replay import MixedReplay

    data, space = pendulum_dataset(100), gym.spaces.Box(-2.0, 2.0, (1,))
    storage = dataset_replay(data, space)
    big = type(storage)(130, 1, 1, (3,), (1,), False, torch.device("cpu"), 0.99)
    big.load_state_dict({**storage.state_dict(), "pos": 100})  # as a storage of room for both, filled by the data
    mixed = MixedReplay(big, 100, 0.25, reward_factor=2.0)
    assert mixed.sample(8).indices.max() < 100  # nothing online yet: the dataset only
    obs = torch.zeros(1, 3)
    for _ in range(10):
        mixed.add(obs, torch.zeros(1, 1), np.ones(1, np.float32), np.zeros((1, 3)), np.zeros(1, bool),
                  np.zeros(1, bool), np.ones(1, bool))
    assert float(big.rewards[105]) == 2.0  # online rewards scaled as the dataset's
    indices = mixed.sample(40).indices
    assert int((indices < 100).sum()) == 10 and int(indices.max()) < 110
    state = mixed.state_dict()
    assert state["size"] == 110 and len(state["rewards"]) == 10
    again = MixedReplay(type(storage)(130, 1, 1, (3,), (1,), False, torch.device("cpu"), 0.99), 100, 0.25)
    again.load_state_dict(state)
    assert torch.equal(again.storage.rewards[100:110], big.rewards[100:110]) and again.storage.size == 110


def test_the_offline_fraction_anneals_over_the_online_steps_from_the_rows_stored():
    """offline.offline_fraction_final: the dataset's share of a batch goes linearly from offline.offline_fraction to
    it over offline.online_steps, read from the online rows stored (a resumed storage draws the same shares)."""
    import gymnasium as gym
    import torch
    from offline_fixtures import dataset_replay

    from rlcli.offline.replay import MixedReplay

    data, space = pendulum_dataset(100), gym.spaces.Box(-2.0, 2.0, (1,))
    storage = dataset_replay(data, space)
    big = type(storage)(140, 1, 1, (3,), (1,), False, torch.device("cpu"), 0.99)
    big.load_state_dict({**storage.state_dict(), "pos": 100})
    mixed = MixedReplay(big, 100, 0.5, final_fraction=0.0, online_steps=20)
    assert mixed.fraction_now() == 0.5
    shares = []
    for _ in range(30):
        mixed.add(torch.zeros(1, 3), torch.zeros(1, 1), np.ones(1, np.float32), np.zeros((1, 3)), np.zeros(1, bool),
                  np.zeros(1, bool), np.ones(1, bool))
        shares.append(int((mixed.sample(40).indices < 100).sum()))
        if len(shares) == 10:
            saved = mixed.state_dict()
    assert shares[9] == 10 and shares[4] == 15  # 10 online rows of 20: a quarter; 5: three eighths
    assert shares[19:] == [0] * 11  # the end of the online steps and after: the final share
    assert shares == sorted(shares, reverse=True)
    again = MixedReplay(type(storage)(140, 1, 1, (3,), (1,), False, torch.device("cpu"), 0.99), 100, 0.5,
                        final_fraction=0.0, online_steps=20)
    again.load_state_dict(saved)  # a resume at 10 online rows
    assert again.fraction_now() == 0.25 and mixed.fraction_now() == 0.0


def test_a_bad_final_offline_fraction_is_one_line():
    from rlcli.run.offline import OfflineSettings

    with pytest.raises(ConfigError, match=r"offline.offline_fraction_final.*1.5.*must be in \[0, 1\]"):
        OfflineSettings(offline_fraction_final=1.5)
    with pytest.raises(ConfigError, match="offline.offline_fraction, which is null"):
        OfflineSettings(offline_fraction=None, offline_fraction_final=0.1)
    assert OfflineSettings(offline_fraction_final=0.0).offline_fraction_final == 0.0
