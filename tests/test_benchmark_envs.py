"""MuJoCo and Box2D out of the box: every shipped env yaml and tuned config composes, builds and is picked up;
RL-Zoo's settings keep SB3's meaning; a cheap MuJoCo learning run and a Box2D smoke run."""

import json
from pathlib import Path

import pytest
import yaml
from conftest import run_cli
from omegaconf import OmegaConf

from rlcli.registry import ALGOS
from rlcli.run.build import build
from rlcli.run.compose import compose_config, conf_dir

CONF = Path(conf_dir())
TUNED = sorted(p for p in (CONF / "tuned").rglob("*.yaml"))
ENVS = sorted(p for p in (CONF / "env").rglob("*.yaml") if p.stem != "gym")


def name_of(path: Path, root: Path) -> str:
    return str(path.relative_to(root).with_suffix(""))


def flat(tree: dict, prefix: str = "") -> dict:
    """{'algo.lr': 1e-3, ...} from a nested yaml mapping."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and key != "kwargs":
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@pytest.mark.parametrize("path", TUNED, ids=[name_of(p, CONF / "tuned") for p in TUNED])
def test_every_tuned_config_is_picked_up_and_builds(path):
    algo, env = name_of(path, CONF / "tuned").split("/", 1)
    cfg = compose_config([f"algo={algo}", f"env={env}", "device=cpu"])
    tuned = flat({k: v for k, v in yaml.safe_load(path.read_text()).items() if k != "defaults"})
    for key, value in tuned.items():
        got = OmegaConf.select(cfg, key)
        got = OmegaConf.to_container(got) if OmegaConf.is_config(got) else got
        assert got == value, f"{key}: {got!r} != tuned {value!r}"
    if ALGOS.spec(str(cfg.algo.name)).offline:  # learns from a dataset only: tests/test_offline_presets.py builds it
        return
    build(cfg).close()  # the values pass every check: algorithm, storage, network, env


@pytest.mark.parametrize("path", ENVS, ids=[name_of(p, CONF / "env") for p in ENVS])
def test_every_env_yaml_makes_its_env(path):
    from rlcli.envs import resolve_env_id

    env = name_of(path, CONF / "env")
    # an env whose actions come with legal-move masks is built with an algorithm that takes them
    algo = ["algo=maskable_ppo"] if env in ("tictactoe", "simple_speaker_listener_v4") else []
    cfg = compose_config([f"env={env}", "device=cpu", *algo])
    # resolve_env_id registers ALE's ids first, as a run does (gym.spec alone depended on an earlier test's import)
    assert cfg.env.id == OmegaConf.create(path.read_text()).id  # resolved: vmas's is vmas/${.scenario}
    if cfg.env.name != "vmas":  # a VMAS id is a label (vmas/<scenario>) for messages and run names, not a maker
        assert resolve_env_id(cfg.env.id).id == cfg.env.id
    if env.startswith(("ALE/", "CarRacing")):  # image envs: built with their CNN in the tuned-config test
        return
    components = build(cfg)
    components.close()


def test_sb3_gradient_steps_minus_one_means_one_step_per_env_step_collected():
    import gymnasium as gym

    from rlcli.actors.normalizer import RunningNorm
    from rlcli.actors.offpolicy import NetworkRecipe
    from rlcli.algos.dqn import DQN
    from rlcli.algos.offpolicy import resolve_gradient_steps

    assert resolve_gradient_steps(-1, 16, 4) == 64 and resolve_gradient_steps(3, 16, 4) == 3
    recipe = NetworkRecipe(obs_dim=4, hidden_sizes=[8], activation="relu", ortho_init=False,
                           normalizer=RunningNorm((4,)))
    algo = DQN(recipe, gym.spaces.Discrete(2), num_envs=2, batch_size=32, learning_starts=0, train_freq=16,
               gradient_steps=-1)
    assert algo.gradient_steps == 32


@pytest.mark.slow
def test_box2d_dqn_with_rl_zoos_learning_starts_0_and_gradient_steps_minus_1(tmp_path):
    run = tmp_path / "run"
    out = run_cli("algo=dqn", "env=LunarLander-v3", "train.total_steps=1600", "train.test_every=800",
                  "train.test_episodes=2", "log.console=false", "train.tb_every=16", f"hydra.run.dir={run}",
                  cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    losses = events.Scalars("train/value_loss")
    assert losses[0].step == 16  # the first update came after the first collect phase: learning_starts=0
    assert len(json.loads((run / "eval.jsonl").read_text().splitlines()[-1])["returns"]) == 2


@pytest.mark.slow
def test_ppo_balances_inverted_pendulum_with_rl_zoos_config(tmp_path):
    """RL-Zoo's tuned PPO config (one env, 32-step rollouts, VecNormalize-style normalization): a test return of
    1000 (the time limit) at 10,016 env steps on seed 0 when measured; the budget here leaves room."""
    out = run_cli("algo=ppo", "env=InvertedPendulum-v5", "train.total_steps=30000", "log.console=false",
                  f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    phases = [json.loads(line) for line in (tmp_path / "run" / "eval.jsonl").read_text().splitlines()]
    assert max(sum(p["returns"]) / len(p["returns"]) for p in phases) >= 950  # InvertedPendulum's threshold


def test_rl_zoo_reference_returns_name_shipped_envs_and_registered_algorithms():
    import csv

    from rlcli.registry import ALGOS

    with (Path(__file__).parent.parent / "benchmark" / "rl_zoo.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) > 50
    for row in rows:
        assert (CONF / "env" / f"{row['env']}.yaml").is_file(), row
        assert row["algo"] in ALGOS.names(), row
        assert int(row["n_timesteps"]) > 0 and float(row["std_reward"]) >= 0


@pytest.mark.slow
def test_benchmark_script_runs_a_row_as_a_resumable_sweep_and_writes_the_table(tmp_path):
    import subprocess
    import sys

    script = Path(__file__).parent.parent / "scripts" / "benchmark.py"
    command = [sys.executable, str(script), "--rows", "trpo:CartPole-v1:2048", "--seeds", "1", "2",
               "--out", str(tmp_path / "bench")]
    out = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr
    table = (tmp_path / "bench" / "results.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| trpo CartPole-v1 |"))
    assert "| 2 | 2,048 |" in row and "500.0 ± 0.0 at 100,000" in row and "(reduced budget)" in row
    again = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert again.returncode == 0 and again.stdout.count("already completed, skipped") + \
        again.stderr.count("already completed, skipped") == 2
