"""A multi-agent run (env=pz) after training: rlcli.load(run).predict on PettingZoo's dict of observations, rl-eval
and rlcli.evaluate with each agent's return beside the team sum (never divided)."""

import csv
import json
from pathlib import Path

import forked_cli
import numpy as np
import pytest

pytest.importorskip("pettingzoo")
from test_multiagent import train  # noqa: E402

import rlcli  # noqa: E402
from rlcli.entry.run_loading import refuse_named_module  # noqa: E402
from rlcli.envs.multiagent import ParallelVectorEnv  # noqa: E402
from rlcli.envs.pz_toys import CoopMatch  # noqa: E402
from rlcli.registry import ConfigError  # noqa: E402

IQL = ["algo=dqn", "env=coop_match", "seed=3", "train.total_steps=2000", "train.test_every=1000",
       "train.test_episodes=10", "algo.lr=1e-3", "algo.gamma=0.5", "algo.learning_starts=200",
       "algo.target_update_interval=200", "algo.exploration_fraction=0.3", "algo.batch_size=64", "algo.train_freq=1"]


@pytest.fixture(scope="module")
def iql_run(tmp_path_factory) -> Path:
    """IQL on the cooperative toy, as test_multiagent_offpolicy.py trains it (it learns all 20 of 20)."""
    run_dir = tmp_path_factory.mktemp("iql") / "run"
    train(IQL, run_dir)
    return run_dir


@pytest.fixture(scope="module")
def mappo_run(tmp_path_factory) -> Path:
    """MAPPO whose group is agent_1 alone (agent_0 does nothing), with the centralized critic's global state."""
    run_dir = tmp_path_factory.mktemp("mappo") / "run"
    train(["algo=mappo", "env=coop_match", "env.agents=[agent_1]", "train.num_envs=4", "algo.n_steps=32",
           "algo.batch_size=64", "train.total_steps=256", "train.test_every=256", "train.test_episodes=2"], run_dir)
    return run_dir


def play(policy, env: CoopMatch, seed: int) -> dict[str, float]:
    """One episode of the PettingZoo env driven by predict on its dicts; checks each action against predict on the
    rows that rlcli's vector env makes of the same episode (a copy of the env, seeded alike)."""
    rows = ParallelVectorEnv([CoopMatch(env.max_cycles, env.leave_at)], "coop", policy.config.env.agents,
                             agent_id=policy.config.env.agent_id, critic_state=policy.config.env.critic_state)
    obs, _ = env.reset(seed=seed)
    row_obs, _ = rows.reset(seed=seed)
    totals = {a: 0.0 for a in env.possible_agents}
    while env.agents:
        # PettingZoo's dict keeps an agent's final observation after its last step: the live agents' are the input
        actions, state = policy.predict({a: obs[a] for a in env.agents})
        assert state is None and set(actions) == set(env.agents)
        by_row = policy.predict(row_obs)[0]
        for i, name in enumerate(rows.agent_names):
            if name in actions:
                assert actions[name] == by_row[i], (name, actions, by_row)
        obs, rewards, *_ = env.step(actions)
        row_obs, *_ = rows.step(np.array([actions.get(name, 0) for name in rows.agent_names]))
        for name, r in rewards.items():
            totals[name] += r
    return totals


def test_predict_takes_pettingzoos_dict_of_observations_and_gives_the_dict_of_actions(iql_run):
    policy = rlcli.load(iql_run)
    for seed in range(3):
        assert play(policy, CoopMatch(), seed) == {"agent_0": 10.0, "agent_1": 10.0}
    # agent_1 leaves after 3 steps: from then on the dicts hold agent_0 alone, and so do the actions
    assert play(policy, CoopMatch(leave_at=3), 7) == {"agent_0": 10.0, "agent_1": 3.0}
    actions, _ = policy.predict({"agent_1": np.eye(3, dtype=np.float32)[2]})
    assert list(actions) == ["agent_1"] and actions["agent_1"] == 0  # cue 2: agent_1 answers 2 + 1 mod 3
    # the single-agent forms still work: one row, or a batch of rows, as the run's envs give them
    row = np.array([0, 1, 0, 1, 0], np.float32)  # cue 1, agent_0's one-hot
    assert policy.predict(row)[0] == 1 and policy.predict(np.stack([row, row]))[0].tolist() == [1, 1]


def test_predict_of_a_group_with_a_centralized_critic_and_an_agent_left_out(mappo_run):
    """The policy never reads the global state, so predict leaves it zero; agent_0, outside the group, gets what
    training gave it (action 0)."""
    policy = rlcli.load(mappo_run)
    for seed in range(2):
        play(policy, CoopMatch(), seed)  # each dict action equals the row action with the env's real global state
    actions, _ = policy.predict({"agent_0": np.eye(3, dtype=np.float32)[1], "agent_1": np.eye(3, dtype=np.float32)[1]})
    assert list(actions) == ["agent_0", "agent_1"] and actions["agent_0"] == 0


def test_a_recurrent_policy_carries_a_state_per_agent(tmp_path):
    """The state is a dict by agent: each agent's carry is the one its row would carry in the run's envs."""
    train(["algo=ippo", "env=coop_match", "actor=gru", "train.num_envs=4", "algo.n_steps=16", "algo.batch_size=32",
           "train.total_steps=128", "train.test_every=0"], tmp_path / "gru")
    policy = rlcli.load(tmp_path / "gru", load="last")
    env, rows = CoopMatch(max_cycles=5, leave_at=3), CoopMatch(max_cycles=5, leave_at=3)
    obs, _ = env.reset(seed=2)
    rows.reset(seed=2)
    state, carry, starts = None, None, None
    while env.agents:
        actions, state = policy.predict({a: obs[a] for a in env.agents}, state)
        x = np.concatenate([np.stack([obs[a] for a in env.agents]), np.eye(2, dtype=np.float32)[:len(env.agents)]], 1)
        by_row, carry = policy.predict(x, None if carry is None else carry[:len(env.agents)], starts)
        starts = False
        assert list(state) == list(env.agents) == list(actions)  # agent_1 leaves after 3 steps: its carry with it
        for i, name in enumerate(env.agents):
            assert actions[name] == by_row[i] and np.array_equal(state[name], carry[i])
        obs, *_ = env.step(actions)
    with pytest.raises(rlcli.RlcliError, match="with a dict of observations, give the dict of states"):
        policy.predict({"agent_0": obs["agent_0"]}, carry)


@pytest.mark.parametrize(("obs", "message"), [
    ({"agent_9": np.zeros(3)}, "obs has the key 'agent_9', not an agent of rlcli.envs.pz_toys:coop_match; its "
                               "agents: agent_0, agent_1"),
    ({"agent_0": np.zeros(4)}, "obs['agent_0'] has the shape (4,); agent 'agent_0' of rlcli.envs.pz_toys:coop_match "
                               "observes (3,) (give one observation per agent)"),
    ({"agent_0": np.array([0.0, np.nan, 1.0])}, "obs holds a non-finite value (nan at index [1])"),
    (np.zeros(3), "or a dict {agent: observation}, as PettingZoo gives them"),
])
def test_a_bad_dict_of_observations_is_one_line(iql_run, obs, message):
    with pytest.raises(rlcli.RlcliError) as error:
        rlcli.load(iql_run).predict(obs)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_rl_eval_and_rlcli_evaluate_give_each_agents_return_beside_the_team_sum(iql_run):
    out = forked_cli.run([str(iql_run), "episodes=5", "num_envs=2"], iql_run.parent, program="rl-eval")
    assert out.returncode == 0, out.stderr
    assert "per agent (mean return; the table's return is their sum): agent_0 10.0, agent_1 10.0" in out.stdout
    record = json.loads((iql_run / "eval" / "best.json").read_text())
    agents = record["agent_returns"]
    assert record["returns"] == [a + b for a, b in zip(agents["agent_0"], agents["agent_1"], strict=True)] == [20.0] * 5
    assert record["agent_means"] == {"agent_0": 10.0, "agent_1": 10.0} and record["mean"] == 20.0  # never divided
    evaluation = rlcli.evaluate(rlcli.load(iql_run), episodes=3)
    assert evaluation.returns == [20.0] * 3 and evaluation.agent_returns == {"agent_0": [10.0] * 3,
                                                                            "agent_1": [10.0] * 3}


@pytest.mark.parametrize("override", ["env.joint=true", "env.agents=[agent_0]", "env.agent_id=false"])
def test_rl_eval_refuses_to_change_what_shapes_the_networks(mappo_run, override):
    """The trained networks read and give the trained layout: another (env.joint=true) said 'algo=ppo cannot handle
    JointActions actions'. The run's own value is taken."""
    out = forked_cli.run([str(mappo_run), "episodes=1", override], mappo_run.parent, program="rl-eval")
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode != 0 and len(lines) == 1, out.stderr
    key = override.split("=")[0]
    assert f"{override}: the policy was trained with {key}=" in lines[0] and "cannot change after training" in lines[0]
    same = forked_cli.run([str(mappo_run), "episodes=1", "env.agents=[agent_1]"], mappo_run.parent, program="rl-eval")
    assert same.returncode == 0, same.stderr


@pytest.mark.parametrize(("env_id", "multiagent", "refused"), [
    ("rlcli.envs.pz_toys:coop_match", True, False),  # rlcli's own module
    ("mpe2.simple_spread_v3", True, False),  # the multiagent extra's packages
    ("not_imported_yet.envs", True, True),  # env=pz imports a module without a colon too
    ("not_imported_yet.envs:make", True, True),
    ("not_imported_yet.envs", False, False),  # a gymnasium id without a colon imports nothing
    ("not_imported_yet.envs:Env-v0", False, True),
])
def test_a_checkpoint_naming_an_env_module_to_import_is_refused_unless_rlcli_trusts_it(env_id, multiagent, refused):
    if refused:
        with pytest.raises(ConfigError, match="a checkpoint's config is not trusted to import a module"):
            refuse_named_module(Path("ckpt.pt"), env_id, "rl-eval", multiagent=multiagent)
    else:
        refuse_named_module(Path("ckpt.pt"), env_id, "rl-eval", multiagent=multiagent)


def test_the_team_return_counts_the_agents_outside_the_group_and_rl_report_shows_each_agent(mappo_run, iql_run,
                                                                                            tmp_path, capsys):
    """coop_match pays both agents alike: with agent_1 alone in the group, the team return (agent_0's rewards too)
    is twice the group's, in eval.jsonl, rl-eval's record and rl-report's columns."""
    from rlcli.entry.rl_report import main as report

    record = json.loads((mappo_run / "eval.jsonl").read_text().splitlines()[-1])
    assert record["returns"] == record["agent_returns"]["agent_1"]
    assert record["team_returns"] == [2 * r for r in record["returns"]] and any(record["returns"])
    iql = json.loads((iql_run / "eval.jsonl").read_text().splitlines()[-1])
    assert iql["team_returns"] == iql["returns"]  # every agent in the group: the team is the group
    out = forked_cli.run([str(mappo_run), "episodes=4"], mappo_run.parent, program="rl-eval")
    assert out.returncode == 0, out.stderr
    evaluated = json.loads((mappo_run / "eval" / "best.json").read_text())
    assert evaluated["team_mean"] == 2 * evaluated["mean"] == 2 * evaluated["agent_means"]["agent_1"]
    assert f"those outside env.agents too: {2 * evaluated['mean']:.1f}" in out.stdout
    report([str(mappo_run), str(iql_run), "--csv", str(tmp_path / "r.csv")])
    assert "wrote" in capsys.readouterr().err
    rows = {row["algo"]: row for row in csv.DictReader((tmp_path / "r.csv").open())}
    assert rows["dqn"]["final_per_agent"] == "agent_0=10 agent_1=10" and rows["dqn"]["final_team_mean"] == ""
    group = float(rows["mappo"]["final_mean"])
    assert float(rows["mappo"]["final_team_mean"]) == 2 * group
    assert rows["mappo"]["final_per_agent"] == f"agent_1={group:g}"


def test_rlcli_train_takes_a_function_that_makes_a_pettingzoo_env(tmp_path):
    """env=<a function returning a PettingZoo env> trains as env=pz (the guide's own-env row): row mode and joint
    mode, and rlcli.load with the function again; the env instance itself, and a function that fails, are one line
    (it said 'must inherit from gymnasium.Env', and algo=qmix 'has one agent')."""
    from rlcli.entry.api import InvalidType, InvalidValue

    def make_match():
        return CoopMatch()

    for algo in ("ippo", "qmix"):
        run = rlcli.train(f"algo={algo} train.total_steps=512 train.num_envs=4 train.test_episodes=2 "
                          "log.console=false log.tensorboard=false", env=make_match, run_dir=tmp_path / algo)
        assert run.finished and run.env_steps >= 512
        policy = rlcli.load(tmp_path / algo, env=make_match)
        obs, _ = make_match().reset(seed=0)
        actions, _ = policy.predict(obs)
        assert set(actions) == set(obs)
    # rl-train resume= from the shell (another process, without the function): the way back is Python's, as for a
    # gymnasium function's env (it said the run's overrides.yaml line was not one rlcli writes)
    done = forked_cli.run([f"resume={tmp_path / 'ippo'}", "train.total_steps=1024"], tmp_path)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode != 0 and len(lines) == 1, done.stderr
    assert "is the env of a Python function (make_match)" in lines[0] and "rlcli.train(resume=" in lines[0], lines
    with pytest.raises(InvalidType, match=r"env=CoopMatch\(...\) is a PettingZoo env instance.*pass the function"):
        rlcli.train("algo=ippo train.total_steps=64", env=CoopMatch(), run_dir=tmp_path / "instance")
    with pytest.raises(InvalidValue, match="calling it to make the env failed: ZeroDivisionError"):
        rlcli.train("algo=ippo train.total_steps=64", env=lambda: 1 / 0, run_dir=tmp_path / "failing")
    assert not (tmp_path / "instance").exists() and not (tmp_path / "failing").exists()
    # a gymnasium function that needs its env.kwargs is not called to find out (it was refused: "missing 1 required
    # positional argument"); two functions of one name get an id each; an id this process lacks names the function
    import gymnasium

    from rlcli.entry.api import env_overrides
    from rlcli.envs import resolve_env_id
    from rlcli.registry import ConfigError

    def make_cartpole(max_episode_steps):
        return gymnasium.make("CartPole-v1", max_episode_steps=max_episode_steps)

    assert env_overrides(make_cartpole) == ["env=gym", "env.id=rlcli-python/make_cartpole-v0"]
    first, second = env_overrides(lambda: CoopMatch()), env_overrides(lambda: CoopMatch())
    assert first[1] != second[1] and first[1].startswith("env.id=rlcli.envs.python_made:env"), (first, second)
    with pytest.raises(ConfigError, match="is the env of a Python function .make_gone. that only the process that "
                       r"trained this run had; pass that function again from Python: rlcli.load\(.*env=make_gone\)"):
        resolve_env_id("rlcli.envs.python_made:make_gone")
