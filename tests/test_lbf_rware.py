"""env=lbf and env=rware (src/rlcli/envs/ma_gym.py): Level-Based Foraging's and the warehouse's Tuple-space gymnasium
envs as PettingZoo Parallel envs. The wrapper against PettingZoo's own API test and against the raw env's step
outputs, each env's world captured and restored exactly (a checkpoint's round trip), runs of rl-train (row and joint
mode, rl-eval, a SIGTERM then resume bit-identical) and one-line errors."""

import io
import json

import forked_cli
import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo")
pytest.importorskip("lbforaging")
pytest.importorskip("rware")
from pettingzoo.test import parallel_api_test  # noqa: E402
from test_multiagent import QUIET, train  # noqa: E402
from test_resume import assert_sigterm_then_resume_is_exact  # noqa: E402

from rlcli.envs.ma_gym import lbf, rware  # noqa: E402
from rlcli.envs.state import get_env_state, set_env_state  # noqa: E402
from rlcli.registry import ENVS, ConfigError  # noqa: E402
from rlcli.services import plain_state  # noqa: E402

# 5x5, 2 players, 2 foods, not cooperative: random play eats food now and then, so rewards are not all zero
SMALL = "Foraging-5x5-2p-2f-v3"
FAST = ["torch_threads=1", "train.log_every=100000"]


def factory(kind, **kwargs):
    return ENVS.build({"name": "pz", "id": f"rlcli.envs.ma_gym:{kind}", "kwargs": kwargs})


@pytest.mark.parametrize("make", [lambda: lbf(), lambda: lbf(SMALL), lambda: rware(max_steps=60)],
                         ids=["lbf-8x8-coop", "lbf-5x5", "rware-tiny"])
def test_the_wrapped_envs_pass_pettingzoos_parallel_api_test(make):
    env = make()
    parallel_api_test(env, num_cycles=100)
    assert env.possible_agents == ["agent_0", "agent_1"]
    obs, _ = env.reset(seed=1)
    assert env.state().shape == env.state_space.shape
    np.testing.assert_array_equal(env.state(), np.concatenate([obs["agent_0"], obs["agent_1"]]))


def test_joint_mode_carries_lbfs_state_bounds_to_the_observation_and_action_spaces():
    """The global state's columns of the joint observation are bounded as LBF's observations are (positions -1..4 on
    5x5, levels), and JointActions names the same bounds for QMIX's mixer (algo.scale_state); every state the env
    gives lies within them."""
    from rlcli.envs.multiagent import JointActions

    envs = ENVS.build({"name": "pz", "id": "rlcli.envs.ma_gym:lbf", "kwargs": {"task": SMALL}, "joint": True}).make(2)
    space, actions = envs.single_observation_space, envs.single_action_space
    assert isinstance(actions, JointActions)
    raw = lbf(task=SMALL)
    np.testing.assert_array_equal(actions.state_low, raw.state_space.low)
    np.testing.assert_array_equal(actions.state_high, raw.state_space.high)
    np.testing.assert_array_equal(space.low[0, -actions.state_size:], raw.state_space.low)
    assert np.isfinite(actions.state_high).all() and (actions.state_high > actions.state_low).all()
    obs, _ = envs.reset(seed=3)
    for _ in range(30):
        state = obs[:, 0, -actions.state_size:]
        assert (state >= actions.state_low).all() and (state <= actions.state_high).all()
        obs = envs.step(np.random.default_rng(0).integers(0, actions.n_actions, (2, 2)))[0]


def test_per_agent_rewards_flags_and_the_team_sum_are_the_raw_envs_own():
    """The wrapper and the rows of env=pz against gymnasium's LBF stepped with the same actions and seed: the same
    observations and per-agent rewards; the episode's team return is the sum of the raw rewards, never divided; the
    step limit ends the episode as truncated, eating every food as terminated."""
    raw = gym.make(SMALL, disable_env_checker=True)  # 50 steps
    envs = factory("lbf", task=SMALL).make(2)  # one copy, two rows
    rng = np.random.default_rng(0)
    seen_reward, ends = False, set()
    for episode in range(6):
        raw_obs, _ = raw.reset(seed=7 if episode == 0 else None)
        if episode == 0:
            obs, _ = envs.reset(seed=7)
        else:  # the copy's reset step
            obs = envs.step(np.zeros(2, np.int64))[0]
        raw_total = np.zeros(2)
        for _ in range(50):
            np.testing.assert_array_equal(obs[:, :12], np.stack(raw_obs))
            actions = rng.integers(0, 6, 2)
            raw_obs, raw_rewards, done, raw_truncated, _ = raw.step(tuple(int(a) for a in actions))
            obs, rewards, terminated, truncated, infos = envs.step(actions)
            np.testing.assert_array_equal(rewards, np.asarray(raw_rewards, np.float64))
            raw_total += raw_rewards
            seen_reward |= bool(np.any(raw_rewards))
            done = done or raw_truncated
            assert (terminated | truncated).all() == done
            if done:
                eaten = raw.unwrapped.field.sum() == 0
                assert terminated.all() == eaten and truncated.all() == (not eaten)
                ends.add("terminated" if eaten else "truncated")
                assert infos["episode"]["r"][0] == raw_total.sum()
                np.testing.assert_array_equal(infos["agent_episode"]["r"], raw_total)
                break
    assert seen_reward and ends == {"terminated", "truncated"}, ends


def checkpoint_round_trip(state):
    buffer = io.BytesIO()
    torch.save(plain_state.encode(state), buffer)
    return plain_state.decode(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))


@pytest.mark.parametrize("kind,kwargs", [("lbf", {"task": SMALL, "max_episode_steps": 30}),
                                         ("rware", {"max_steps": 40, "reward_type": "global"})])
def test_the_worlds_state_goes_through_a_checkpoint_and_the_env_goes_on_exactly(kind, kwargs):
    """Mid-episode, each copy's world (RNG, grid, players or robots, shelves a robot carries, requests) is captured
    and restored into envs built afresh: both go on with the same observations, rewards and flags across resets."""
    rng = np.random.default_rng(1)
    envs = factory(kind, **kwargs).make(4)  # two copies
    envs.reset(seed=3)
    for _ in range(17):
        envs.step(rng.integers(0, 5, 4))
    if kind == "rware":  # a robot carrying a shelf (its link to the shelves kept by index)
        raw = envs.copies[0].gym_env
        raw.agents[0].carrying_shelf = raw.shelfs[3]
    state = checkpoint_round_trip(get_env_state(envs))
    other = factory(kind, **kwargs).make(4)
    other.reset(seed=99)
    set_env_state(other, state)
    actions = [rng.integers(0, 5, 4) for _ in range(60)]
    unrestored = factory(kind, **kwargs).make(4)
    unrestored.reset(seed=99)
    outputs = [[env.step(a)[:4] for a in actions] for env in (envs, other, unrestored)]
    for a, b in zip(outputs[0], outputs[1], strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
    assert any(not np.array_equal(a[0], b[0]) for a, b in zip(outputs[0], outputs[2], strict=True))


def test_ippo_trains_on_lbf_and_rl_eval_reads_the_run(tmp_path):
    run_dir = tmp_path / "ippo"
    train(["algo=ippo", "env=lbf", "train.num_envs=4", "train.total_steps=512", "algo.n_steps=64",
           "algo.batch_size=128", "train.test_every=512", "train.test_episodes=2", *FAST], run_dir)
    record = json.loads((run_dir / "eval.jsonl").read_text().splitlines()[-1])
    assert record["env_steps"] == 512 and len(record["returns"]) == 2
    agents = record["agent_returns"]
    assert record["returns"] == [a + b for a, b in zip(agents["agent_0"], agents["agent_1"], strict=True)]
    done = forked_cli.run([str(run_dir), "episodes=2"], tmp_path, program="rl-eval")
    assert done.returncode == 0, done.stderr
    assert "agent_0" in done.stdout and "agent_1" in done.stdout


@pytest.mark.parametrize("args", [
    ["algo=qmix", "env=lbf", "train.num_envs=2", "train.total_steps=300", "algo.learning_starts=100",
     "algo.scale_state=true"],
    ["algo=mappo", "env=rware", "env.kwargs.max_steps=30", "train.num_envs=4", "train.total_steps=256",
     "algo.n_steps=32", "algo.batch_size=64"]], ids=["qmix-lbf-joint", "mappo-rware"])
def test_joint_mode_on_lbf_and_a_warehouse_run(args, tmp_path):
    train([*args, "train.test_every=0", *FAST], tmp_path / "run")
    assert (tmp_path / "run" / "checkpoints").is_dir()


def test_an_lbf_run_stopped_after_its_first_checkpoint_resumes_bit_identically(tmp_path):
    args = ["algo=ippo", "env=lbf", "train.num_envs=4", "train.total_steps=768", "algo.n_steps=32",
            "algo.batch_size=64", "train.checkpoint_every=128", "train.test_every=384", "train.test_episodes=2",
            *FAST, *QUIET]
    assert_sigterm_then_resume_is_exact(args, 768, tmp_path)


@pytest.mark.parametrize("kind,kwargs,message", [
    ("lbf", {"task": "Foraging-8x8-2p-2f-coop-v2"}, "Foraging-8x8-2p-2f-coop-v3"),
    ("rware", {"task": "rware-tiny-2ag"}, "rware-<tiny|small|medium|large>"),
    ("lbf", {"sigth": 2}, "choose from: task, players"),
    ("rware", {"reward_type": "shared"}, "choose from: GLOBAL, INDIVIDUAL, TWO_STAGE"),
    ("rware", {"observation_type": "image_dict"}, "takes the flat (Box) ones")])
def test_bad_settings_are_one_line(kind, kwargs, message):
    with pytest.raises(ConfigError) as error:
        factory(kind, **kwargs)
    assert message in str(error.value) and "\n" not in str(error.value), error.value


def test_a_bad_task_from_the_cli_is_one_line(tmp_path):
    done = forked_cli.run(["algo=ippo", "env=lbf", "env.kwargs.task=Foraging-9x9-2p-2f-coop", *QUIET,
                           f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if "Foraging" in line]
    assert len(lines) == 1 and "Foraging-9x9-2p-2f-coop-v3" in lines[0], done.stderr


def test_a_missing_package_names_the_extra(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_rware(name, *args, **kwargs):
        if name == "rware":
            raise ImportError("No module named 'rware'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_rware)
    with pytest.raises(ConfigError, match=r"env=rware needs the rware package: pip install -e '.\[multiagent\]'"):
        rware()


def test_drawing_without_a_display_is_one_line(monkeypatch):
    monkeypatch.delenv("DISPLAY", raising=False)
    env = rware(render_mode="rgb_array")
    env.reset(seed=0)
    with pytest.raises(ConfigError, match="needs a display") as error:
        env.render()
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("kind", ["lbf", "rware"])
def test_videos_without_a_display_are_one_line_before_training(kind, tmp_path):
    """log.video_every on an env that draws with pyglet: one line before anything is written (it crashed with a
    traceback at the first video, after training, and kept no checkpoint)."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "DISPLAY"}
    out = forked_cli.run(["algo=ippo", f"env={kind}", "train.total_steps=2048", "log.video_every=1024", *QUIET,
                          f"hydra.run.dir={tmp_path / 'run'}"], tmp_path, env=env)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0].startswith(f"rl-train: error: log.video_every=1024: env={kind} draws its frames with pyglet, "
                               "which needs a display") and "xvfb-run <the command>" in lines[0], lines[0]
    assert not (tmp_path / "run").exists()


def test_lbf_loads_food_in_player_order_not_in_memory_order():
    """Two players loading at once: LBF pops them from a set, whose order followed their memory addresses, so
    which one got the food could differ between a run and its resume in another process. Players hash by their
    index (envs/ma_gym.py), so player 0 loads first: alone it eats the level-1 food beside it, and player 1 alone
    cannot lift the level-2 food they both touch (had player 1 gone first, the two would have lifted it)."""
    raw = lbf(task="Foraging-8x8-2p-2f-v3").gym_env
    raw.reset(seed=0)
    first, second = raw.players
    assert [hash(p) for p in raw.players] == [0, 1] and first != second
    raw.field[:] = 0
    raw.field[2, 3], raw.field[4, 3] = 1, 2
    first.position, second.position = (3, 3), (5, 3)
    first.level = second.level = 1
    raw._food_spawned = raw.field.sum()
    raw._gen_valid_moves()
    _, rewards, *_ = raw.step((5, 5))  # both load
    assert rewards[0] > 0 and rewards[1] == 0
    assert raw.field[2, 3] == 0 and raw.field[4, 3] == 2
