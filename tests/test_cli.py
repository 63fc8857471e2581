"""`rl-train` as a subprocess: a tiny run writes everything, bad input is one line and writes nothing."""

import json
import os
import subprocess
import sys
from pathlib import Path

import forked_cli
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlcli.run.compose import group_options
from rlcli.services import checkpoint

TINY = ["train.total_steps=2048", "train.test_every=1024", "train.log_every=1024", "train.test_episodes=2",
        "log.console=false"]
PLUGINS = str(Path(__file__).parent / "plugins")


def test_tiny_ppo_run_writes_tensorboard_checkpoint_log_and_test_records(cli, tmp_path):
    run = tmp_path / "run"
    out = cli("algo=ppo", "env=CartPole-v1", *TINY, f"hydra.run.dir={run}")
    assert out.returncode == 0, out.stderr
    tags = set()
    for events in (run / "tb").glob("events.*"):
        acc = EventAccumulator(str(events))
        acc.Reload()
        tags |= set(acc.Tags()["scalars"])
    for tag in ["eval/return_mean", "eval/return_std", "rollout/return_mean", "rollout/ep_len_mean", "time/sps",
                "train/policy_loss", "train/value_loss", "train/entropy", "train/approx_kl",
                "train/clip_fraction", "train/explained_variance", "train/learning_rate"]:
        assert tag in tags, f"missing TensorBoard tag {tag}"
    steps = [r.step for r in acc.Scalars("eval/return_mean")]
    assert steps == [1024, 2048]  # x axis is env steps
    records = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
    assert [r["env_steps"] for r in records] == [1024, 2048] and len(records[0]["returns"]) == 2
    assert "step 2,048" in (run / "train.log").read_text() or "step 2048" in (run / "train.log").read_text()
    ckpts = list((run / "checkpoints").glob("ckpt_*.pt"))
    assert len(ckpts) == 1 and not list((run / "checkpoints").glob("*.tmp"))
    data = checkpoint.load(ckpts[0])
    assert data["state"]["env_steps"] == 2048 and data["config"]["algo"]["name"] == "ppo"
    assert (run / ".hydra" / "config.yaml").is_file()


def test_a2c_on_box_actions_with_normalization_runs(cli, tmp_path):
    out = cli("algo=a2c", "env=Pendulum-v1", *TINY, "env.normalize_obs=true", "env.normalize_reward=true",
              "train.vector_mode=async", f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 0, out.stderr
    state = checkpoint.load(next((tmp_path / "run" / "checkpoints").glob("*.pt")))
    assert state["algo"]["networks"]["normalizer.count"] > 2000  # statistics travel with the agent


def test_stop_reward_stops_early_and_null_never_stops(cli, tmp_path):
    args = ["algo=ppo", "env=CartPole-v1", "train.total_steps=4096", "train.test_every=512", "train.log_every=512",
            "train.test_episodes=2", "log.console=false"]
    early = cli(*args, "train.stop_reward=5", f"hydra.run.dir={tmp_path / 'a'}")
    assert early.returncode == 0, early.stderr
    assert "stopping at 512 env steps" in (tmp_path / "a" / "train.log").read_text()
    full = cli(*args, "train.stop_reward=null", f"hydra.run.dir={tmp_path / 'b'}")
    assert full.returncode == 0, full.stderr
    assert len((tmp_path / "b" / "eval.jsonl").read_text().splitlines()) == 8


def test_deterministic_runs_are_bit_identical(cli, tmp_path):
    weights = []
    for name in ("a", "b"):
        out = cli("algo=ppo", "env=CartPole-v1", *TINY, "deterministic=true", "seed=7",
                  f"hydra.run.dir={tmp_path / name}")
        assert out.returncode == 0, out.stderr
        ckpt = checkpoint.load(next((tmp_path / name / "checkpoints").glob("*.pt")))
        weights.append(ckpt["algo"])
    for key, value in weights[0]["networks"].items():
        assert torch.equal(value, weights[1]["networks"][key]), key
    records = [[(r["returns"], r["lengths"]) for r in map(json.loads, (tmp_path / n / "eval.jsonl").open())]
               for n in ("a", "b")]
    assert records[0] == records[1]


BAD_INPUT = [
    (["algo=nope"], "unknown algo 'nope'",
     f"choose from: {', '.join(group_options('algo'))}"),  # every algo config (the registered ones, ippo, mappo)
    (["algo=rnd_ppo", "actor=lstm"], "algo=rnd_ppo does not support actor=lstm", "choose from: mlp"),
    (["+env.kwargs.foo=1"], "env CartPole-v1 refused env.kwargs={'foo': 1}", "unexpected keyword argument 'foo'"),
    (["algo=maskable_ppo", "env=ValidMoves-v0", "env.kwargs.mask_in=nope"], "mask_in='nope'",
     "choose from method, info, obs"),
    (["algo=maskable_ppo", "env=CartPole-v1"], "env CartPole-v1 gives none", "an action_masks() method"),
    (["actor=cnn"], "actor=cnn needs image observations", "use actor=mlp"),
    (["algo.schedules.ent_coef=linear:0.01"], "algo.schedules.ent_coef='linear:0.01' does not parse", "linear:A:B"),
    (["algo.schedules.n_epochs=linear:10:1"], "no numeric parameter 'n_epochs'", "schedulable: clip_range"),
    (["algo=ppo", "algo.clip_range=null"], "algo.clip_range=null", "only with the KL penalty"),
    (["algo=dqn", "actor=gru"], "algo=dqn with actor=gru learns from stored sequences", "use buffer=sequence"),
    (["algo=td3", "env=Pendulum-v1", "actor=gru"], "algo=td3 does not support actor=gru", "choose from: mlp, cnn"),
    (["actor=lstm", "env=CartPoleNoVel-v1", "algo.batch_size=100"], "algo.batch_size=100", "multiple of algo.n_steps"),
    (["env.observation_indices=[0,7]"], "env.observation_indices=[0, 7]", "must be in [0, 3]"),
    (["env=NoSuchEnv-v0"], "unknown env 'NoSuchEnv-v0'", "CartPole-v1"),
    (["env=gym", "env.id=NoSuchEnv-v0"], "env.id='NoSuchEnv-v0' is not a registered gymnasium id", "pprint_registry"),
    (["algo.lr=-1"], "algo.lr=-1", "must be > 0"),
    (["train.total_steps=0"], "train.total_steps=0", "must be > 0"),
    (["device=cuda:7"], "device='cuda:7'", "choose from"),
    (["algo.clip_range=abc"], "algo.clip_range='abc'", "expected a number"),
    (["algo.lrr=1e-3"], "unknown key 'algo.lrr'", "did you mean 'algo.lr'"),
    # another algorithm's setting is named as such, not matched to the nearest of this one's
    (["algo=vdn", "env=coop_match", "algo.scale_state=true"], "unknown key 'algo.scale_state' (a setting of "
     "algo=qmix, not of algo=vdn)", "valid keys: batch_size"),
    (["env.normalise_obs=true"], "unknown key 'env.normalise_obs'", "did you mean 'env.normalize_obs'"),
    (["env.kwargs.sutton_barto_reward=true"], "'env.kwargs.sutton_barto_reward' is not in the config yet",
     "+env.kwargs.sutton_barto_reward=true"),
    (["actor.activation=swish"], "actor.activation='swish'", "choose from: tanh"),
    (["algo.batch_size=100000"], "algo.batch_size=100000", "n_steps * num_envs"),
    (["algo=dqn", "env=gym", "env.id=odd_envs:MultiBinaryToy-v0"], "algo=dqn cannot handle MultiBinary actions",
     "it supports: Discrete"),
    # off-policy family
    (["algo=dqn", "env=Pendulum-v1"], "algo=dqn cannot handle Box actions", "it supports: Discrete"),
    (["algo=sac", "env=CartPole-v1"], "algo=sac cannot handle Discrete actions", "it supports: Box"),
    (["algo=td3", "env=CartPole-v1"], "algo=td3 cannot handle Discrete actions", "it supports: Box"),
    (["algo=dqn", "buffer=rollout"], "buffer=rollout does not fit the off-policy algo=dqn",
     "choose from: ere, her, nstep, per, replay"),
    (["algo=ppo", "buffer=replay"], "buffer=replay does not fit the on-policy algo=ppo", "rollout"),
    (["algo=dqn", "buffer.capacity=0"], "buffer.capacity=0", "must be > 0"),
    (["algo=ppo", "actor.obs_extractor=[32]"], "actor.obs_extractor and actor.act_extractor shape off-policy",
     "actor.hidden_sizes"),
    (["algo=dqn", "buffer=her"], "buffer=her needs a goal-conditioned env", "env=BitFlipping-v0"),
    (["algo=sac", "env=Pendulum-v1", "algo.batch_size=5000", "buffer.capacity=1000"], "buffer.capacity=1000",
     "algo.batch_size=5000"),
    (["algo=dqn", "algo.gradient_steps=-2"], "algo.gradient_steps=-2", "or -1"),
    (["algo=td3", "env=Pendulum-v1", "algo.noise=pink"], "algo.noise='pink'", "gaussian, ornstein_uhlenbeck"),
    (["+algo.lr=1e-3"], "+algo.lr=1e-3: algo.lr is already in the config, so it takes no '+'", "algo.lr=1e-3"),
    # a BenchMARL user's IQL (independent Q-learning) is not rlcli's offline IQL
    (["algo=iql", "env=coop_match"], "algo=iql learns from a dataset only", "IQL, independent Q-learning, is algo=dqn"),
    # Hydra's grammar: its lexer's exception name and the override were all it said
    (["env.kwargs.name=it's"], "cannot parse \"env.kwargs.name=it's\"", "env.kwargs.name='...'"),
    (["seed=[1"], "cannot parse 'seed=[1': no viable alternative at input '[1'", "seed='...'"),
    # tuned follows algo and env: a value naming no shipped file was skipped silently, true/false stopped in Hydra
    (["tuned=true"], "tuned=true: the tuned settings follow algo and env by themselves", "~tuned"),
    (["tuned=ppo/CartPole"], "unknown tuned 'ppo/CartPole' (did you mean 'ppo/CartPole-v1'?)", "a2c/CartPole-v1"),
]


@pytest.mark.parametrize(("args", "names", "allowed"), BAD_INPUT, ids=[" ".join(b[0]) for b in BAD_INPUT])
def test_bad_input_is_one_clear_line_and_leaves_nothing_behind(args, names, allowed, tmp_path):
    # forked from the tests' server process (tests/forked_cli.py: PYTHONPATH's folders go on sys.path as the
    # interpreter would put them), not ~3 s of imports in a fresh process for each of these cases
    env = dict(os.environ, PYTHONPATH=PLUGINS)
    out = forked_cli.run([*args, "log.console=false"], tmp_path, timeout=120, env=env)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2, out.stderr
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("rl-train: error: ") and names in lines[0] and allowed in lines[0], lines[0]
    assert not list(tmp_path.rglob("*.pt")) and not (tmp_path / "runs").exists()


def test_module_colon_ids_work_for_registered_plugin_envs(tmp_path):
    env = dict(os.environ, PYTHONPATH=PLUGINS)
    out = forked_cli.run(["--cfg", "job", "env=gym", "env.id=odd_envs:MultiBinaryToy-v0"], tmp_path, timeout=120,
                         env=env)
    assert out.returncode == 0 and "odd_envs:MultiBinaryToy-v0" in out.stdout


def test_cfg_job_prints_composed_config_with_tuned_values(cli):
    out = cli("--cfg", "job", "algo=ppo", "env=CartPole-v1")
    assert out.returncode == 0, out.stderr
    assert "n_steps: 32" in out.stdout and "batch_size: 256" in out.stdout


FAST_ERRORS = [["algo=nope"], ["algo.lrr=1e-3"], ["algo.learning_rate=1e-3"], ["env=gym", "env.id=NoSuchEnv-v0"],
               ["train.total_step=10"], ["env.normalise_obs=true"]]


@pytest.mark.parametrize("args", FAST_ERRORS, ids=[" ".join(a) for a in FAST_ERRORS])
def test_config_errors_come_before_torch_is_imported(args, tmp_path):
    """Group, key, syntax and env-id mistakes are answered from the composed config and gymnasium's registry alone,
    so they come back in about the time `--cfg job` takes instead of waiting ~1.5 s for torch to import."""
    probe = ("import sys\nfrom rlcli.entry.rl_train import main\ntry:\n    main(sys.argv[1:])\n"
             "except SystemExit as e:\n"
             "    print('exit', e.code, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", probe, *args], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert "rl-train: error: " in out.stderr, out.stderr
    assert out.stdout.strip() == "exit 2 False", out.stdout + out.stderr
