"""algo.groups: each group of env.groups its own on-policy algorithm on one shared rollout (algos/grouped.py). A
group's update is exactly its algorithm's update on its own agents' columns of the rollout (its GAE with its own
gamma, its minibatches, its optimizer), acting gives each row its own group's policy, a grouped run trains, resumes
bit for bit, warm-starts from a shared or an env.groups run, runs on Ray workers, and its mistakes are one line."""

import copy

import forked_cli
import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo")
from test_multiagent import QUIET, final, train  # noqa: E402
from test_multiagent_groups import play_simple_tag  # noqa: E402
from test_resume import assert_equal_state, assert_sigterm_then_resume_is_exact  # noqa: E402

from rlcli.algos.grouped import GroupedOnPolicy, build_grouped  # noqa: E402
from rlcli.buffers.rollout import RolloutBuffer, compute_gae  # noqa: E402
from rlcli.envs.multiagent import AgentGroups  # noqa: E402
from rlcli.registry import ConfigError  # noqa: E402
from rlcli.schedules import build_schedules  # noqa: E402

OWN, N, COPIES, STEPS = 4, 3, 2, 8
LAYOUT = AgentGroups(("hunters", "prey"), (0, 0, 1), (False, False), OWN)
PPO = {"name": "ppo", "n_steps": STEPS, "batch_size": 8, "n_epochs": 2, "lr": 3e-4, "gamma": 0.99}
FAST = ["train.num_envs=8", "algo.n_steps=16", "algo.batch_size=16", "algo.n_epochs=2", "train.test_episodes=4",
        "actor.hidden_sizes=[16,16]", "torch_threads=1"]
TAG = ["algo=ippo", "env=simple_tag_v3", "env.kwargs.max_cycles=10"]


class Factory:
    normalize_obs, clip_obs = False, 10.0


def rows_space(layout: AgentGroups = LAYOUT) -> gym.spaces.Box:
    space = gym.spaces.Box(-np.inf, np.inf, (OWN + N,), np.float32)
    space.group_layout = layout
    return space


def grouped(groups: dict, base: dict = PPO, layout: AgentGroups = LAYOUT) -> GroupedOnPolicy:
    torch.manual_seed(0)
    return build_grouped(groups, dict(base), {"name": "mlp", "hidden_sizes": [16, 16]}, Factory(),
                         rows_space(layout), gym.spaces.Discrete(3), torch.device("cpu"), COPIES * N)


def row_obs(rows: int) -> torch.Tensor:
    """Random own observations, each row's one-hot: row r is agent r % N (copies of the env one after another)."""
    obs = torch.zeros(rows, OWN + N)
    obs[:, :OWN] = torch.randn(rows, OWN)
    obs[torch.arange(rows), OWN + torch.arange(rows) % N] = 1.0
    return obs


def filled_rollout(algo: GroupedOnPolicy) -> tuple[RolloutBuffer, torch.Tensor]:
    rows = COPIES * N
    buffer = RolloutBuffer(STEPS, rows, (OWN + N,), (), True, torch.device("cpu"))
    generator = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        obs = row_obs(rows)
        out = algo.act(obs)
        done = (torch.rand(rows, generator=generator) < 0.1).float()
        buffer.add(obs, out.actions, out.log_probs, out.values, torch.randn(rows, generator=generator),
                   done * 0.5, done, torch.ones(rows))
    return buffer, row_obs(rows)


def columns_of(group: int) -> torch.Tensor:
    return torch.tensor([r for r in range(COPIES * N) if LAYOUT.group_of[r % N] == group])


# ------------------------------------------------------------------------------------------------ the update

def test_each_group_learns_exactly_as_its_algorithm_on_its_own_columns():
    """Hunters on PPO with gamma 0.9 and a small clip, the prey on A2C: the grouped update gives each group's weights
    and optimizer state bit for bit what that algorithm's own update on the group's columns gives, and the returns
    are compute_gae's on those columns with the group's gamma and lambda."""
    algo = grouped({"hunters": {"gamma": 0.9, "clip_range": 0.1}, "prey": {"name": "a2c", "lr": 1e-3}})
    assert type(algo.algos["prey"]).__name__ == "A2C" and algo.algos["prey"].n_steps == STEPS
    assert algo.algos["prey"].gamma == 0.99 and algo.algos["hunters"].gamma == 0.9
    buffer, last_obs = filled_rollout(algo)
    alone = {name: copy.deepcopy(sub) for name, sub in algo.algos.items()}
    torch.manual_seed(5)
    algo.finish_rollout(buffer, last_obs, None)
    parts = list(algo._parts)
    metrics = algo.update(buffer, None)
    assert {"hunters/policy_loss", "hunters/approx_kl", "prey/policy_loss", "prey/value_loss"} <= set(metrics)
    torch.manual_seed(5)
    for k, sub in enumerate(alone.values()):
        part = buffer.columns(columns_of(k))
        sub.finish_rollout(part, last_obs[columns_of(k)], None)
        with torch.no_grad():
            last_values = sub.networks.value(last_obs[columns_of(k)])
        advantages, returns = compute_gae(buffer.rewards[:, columns_of(k)], buffer.values[:, columns_of(k)],
                                          buffer.terminated[:, columns_of(k)], buffer.dones[:, columns_of(k)],
                                          last_values, sub.gamma, sub.gae_lambda)
        assert torch.equal(parts[k].returns, returns) and torch.equal(parts[k].advantages, advantages)
        sub.update(part, None)
    for name, sub in alone.items():
        assert_equal_state(sub.state_dict(), algo.algos[name].state_dict(), name)


def test_one_groups_rewards_change_its_weights_and_no_other_groups():
    """The same rollout twice from the same weights and stream, the hunters' rewards changed in the second: the
    hunters learn something else, the prey exactly the same."""
    results = []
    for shift in (0.0, 1.0):
        algo = grouped({"prey": {"name": "a2c"}})
        buffer, last_obs = filled_rollout(algo)
        buffer.rewards[:, columns_of(0)] += shift
        torch.manual_seed(5)
        algo.finish_rollout(buffer, last_obs, None)
        algo.update(buffer, None)
        results.append({name: sub.state_dict()["networks"] for name, sub in algo.algos.items()})
    assert_equal_state(results[0]["prey"], results[1]["prey"], "prey")
    assert any(not torch.equal(v, results[1]["hunters"][k]) for k, v in results[0]["hunters"].items())


def test_each_row_acts_by_its_own_groups_policy():
    algo = grouped({"prey": {"ent_coef": 0.01}})
    obs = row_obs(COPIES * N)
    out = algo.act(obs, deterministic=True)
    for k, sub in enumerate(algo.algos.values()):
        own = sub.act(obs[columns_of(k)], deterministic=True)
        assert torch.equal(out.actions[columns_of(k)], own.actions)
        # (computed in a batch of every row: equal up to the matmul's summation order)
        torch.testing.assert_close(out.values[columns_of(k)], own.values)
        torch.testing.assert_close(out.log_probs[columns_of(k)], own.log_probs)


def test_separate_agents_in_a_group_get_their_own_networks_and_one_normalizer_serves_all():
    layout = AgentGroups(("hunters", "prey"), (0, 0, 1), (True, False), OWN)
    algo = grouped({}, layout=layout)
    hunters, prey = algo.algos["hunters"].networks, algo.algos["prey"].networks
    assert len(hunters.members) == 2 and not hasattr(prey, "members")
    assert hunters.normalizer is prey.normalizer is algo.networks.normalizer
    obs = row_obs(COPIES * N)
    rows = columns_of(0)
    for m, member in enumerate(hunters.members):  # hunter m's rows go through copy m
        mine = rows[(rows % N) == m]
        assert torch.equal(hunters.value(obs[mine]), member.value(obs[mine]))


def test_a_group_can_have_its_own_network_sizes():
    algo = grouped({"prey": {"actor": {"hidden_sizes": [8]}, "lr": 1e-3}})
    widths = {name: [p.shape[0] for p in sub.networks.pi_body.parameters()] for name, sub in algo.algos.items()}
    assert widths == {"hunters": [16, 16, 16, 16], "prey": [8, 8]}
    assert algo.algos["prey"].optimizer.param_groups[0]["lr"] == 1e-3


def test_schedules_set_every_group_or_one_and_each_groups_defaults_are_its_own():
    algo = grouped({"prey": {"name": "a2c", "lr_schedule": "linear"}})
    assert set(algo.default_schedules) == {"prey.lr_scale"}
    scheduled = build_schedules(algo, {"ent_coef": "linear:0.1:0.0"})
    for item in scheduled:
        item.set(item.schedule(0.5))
    assert algo.algos["hunters"].ent_coef == algo.algos["prey"].ent_coef == pytest.approx(0.05)
    assert algo.algos["prey"].lr_scale == pytest.approx(0.5) and algo.algos["hunters"].lr_scale == 1.0
    assert algo.ent_coef == pytest.approx(0.05) and getattr(algo, "prey.lr_scale") == pytest.approx(0.5)
    with pytest.raises(ConfigError, match="algo.schedules.bogus"):
        build_schedules(algo, {"bogus": "constant:1"})
    # gamma, which the run also reads on the algorithm, reaches every group
    for item in build_schedules(algo, {"gamma": "constant:0.5"}):
        item.set(item.schedule(0.0))
    assert algo.gamma == algo.algos["hunters"].gamma == algo.algos["prey"].gamma == 0.5
    # one group's schedule (algo.schedules.prey.ent_coef), and lr for all replacing the groups' own lr_scale
    scheduled = build_schedules(algo, {"prey": {"ent_coef": "constant:0.3"}, "lr": "constant:1e-4"})
    assert [item.name for item in scheduled] == ["prey.ent_coef", "lr"]
    for item in scheduled:
        item.set(item.schedule(0.0))
    assert algo.algos["prey"].ent_coef == 0.3 and algo.algos["hunters"].ent_coef == pytest.approx(0.05)


def test_a_setting_changed_on_resume_keeps_a_groups_own_value():
    """`rl-train resume=<run> algo.ent_coef=0.02`: the groups on the run's value take the new one; a group with
    its own (algo.groups.prey.ent_coef) keeps it."""
    from rlcli.run.resume import new_settings_kept

    algo = grouped({"prey": {"ent_coef": 0.01}}, {**PPO, "ent_coef": 0.02})
    state = algo.state_dict()
    with new_settings_kept(algo, [("algo.ent_coef", 0.0, 0.02)]):
        algo.ent_coef = 0.0  # what a checkpoint's values would do
        algo.load_state_dict(state)
    assert algo.algos["hunters"].ent_coef == 0.02 and algo.algos["prey"].ent_coef == 0.01


@pytest.mark.parametrize(("groups", "base", "message"), [
    ({"wolves": {"lr": 1e-3}}, PPO, "algo.groups.wolves: env.groups has no group 'wolves'; its groups: hunters, prey"),
    ({"prey": {"name": "dqn"}}, PPO, "algo.groups.prey.name=dqn: a group's algorithm shares the run's rollout"),
    ({"prey": {"name": "nonsense"}}, PPO, "algo.groups.prey.name=nonsense: a group's algorithm shares the run's "
                                          "rollout (algo=ppo), so it is an on-policy actor-critic one with the same "
                                          "use of action masks; choose from: a2c, pg, ppo, ppo_kl, trpo"),
    ({"prey": {"name": "a2cc"}}, PPO, "choose from: a2c, pg, ppo, ppo_kl, trpo (did you mean 'a2c'?)"),
    ({"prey": {"n_steps": 4}}, PPO, "algo.groups.prey.n_steps=4: the groups collect one rollout, so each group's "
                                    "n_steps is the run's algo.n_steps=8"),
    ({"prey": {"batch_size": 64}}, PPO, "algo.groups.prey (ppo): algo.groups.prey.batch_size=64 is invalid: must be "
                                        "in [1, n_steps * the group's rows = 16]"),
    ({"prey": 3}, PPO, "algo.groups.prey=3: a mapping of the group's settings"),
    ({"prey": {"actor": {"name": "cnn"}}}, PPO, "algo.groups.prey.actor.name=cnn: a group's network is the run's "
                                               "actor with other settings"),
    ({"prey": {"actor": 3}}, PPO, "algo.groups.prey.actor=3: a mapping of the run's actor settings"),
    ({"prey": {"actor": {"hidden": [3]}}}, PPO, "algo.groups.prey (ppo): unknown key 'actor.hidden'"),
    ([1], PPO, "algo.groups=[1]: a mapping {group: {setting: value}}"),
])
def test_a_bad_group_setting_is_one_line(groups, base, message):
    with pytest.raises(ConfigError) as error:
        grouped(groups, base)
    assert message in str(error.value) and "\n" not in str(error.value)


# ------------------------------------------------------------------------------------------------------- runs

@pytest.mark.slow
def test_a_grouped_run_trains_evaluates_and_resumes_bit_identically(tmp_path):
    pytest.importorskip("mpe2")
    args = [*TAG, "algo.groups.adversary.lr=1e-3", "algo.groups.agent.name=a2c", "algo.groups.agent.ent_coef=0.01",
            "train.total_steps=1024", "train.checkpoint_every=256", "train.test_every=512", "train.log_every=128",
            *FAST, *QUIET]
    stopped = assert_sigterm_then_resume_is_exact(args, 1024, tmp_path)
    state = final(stopped)["algo"]
    assert set(state["groups"]) == {"adversary", "agent"} and "kl_coef" in state["groups"]["adversary"]
    assert {key.split(".")[1] for key in state["networks"]} == {"adversary", "agent"}
    table = [line for line in (stopped / "train.log").read_text().splitlines() if "| return " in line][-1]
    assert "| adversary pi loss " in table and "| agent pi loss " in table and "| agent v loss " in table, table
    done = forked_cli.run([str(stopped), "episodes=2"], tmp_path, program="rl-eval")
    assert done.returncode == 0, done.stderr
    assert "per group (mean of the sum of its agents' returns): adversary " in done.stdout
    play_simple_tag(stopped)
    done = forked_cli.run([str(stopped), "episodes=1", "export=torchscript"], tmp_path, program="rl-eval")
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_warm_starts_from_a_shared_run_and_from_an_env_groups_run_copy_into_each_groups_network(tmp_path):
    pytest.importorskip("mpe2")
    import rlcli
    from rlcli.actors.weights import load_network_weights

    common = [*TAG, "train.total_steps=256", "train.test_every=256", *FAST]
    train([*common, "env.groups=null"], tmp_path / "shared")
    train(common, tmp_path / "copies")  # simple_tag's yaml: env.groups=prefix, a network per group
    train([*common, "algo.groups.agent.ent_coef=0.01"], tmp_path / "grouped")
    networks = rlcli.load(tmp_path / "grouped").networks
    shared = rlcli.load(tmp_path / "shared").networks.state_dict()
    load_network_weights(networks, tmp_path / "shared")
    for name in ("adversary", "agent"):
        own = networks.groups[name].state_dict()
        assert all(torch.equal(v, shared[k]) for k, v in own.items())
    # a group whose agents each have a network: every one starts from the shared network
    separate = "env.groups={adversary: {agents: [adversary_0, adversary_1, adversary_2], share_params: false}, " \
               "agent: [agent_0]}"
    train([*common, separate, "algo.groups.agent.name=a2c", f"actor.init_from={tmp_path / 'shared'}"],
          tmp_path / "warm")
    members = rlcli.load(tmp_path / "warm").networks.groups["adversary"].members
    assert len(members) == 3
    # (trained since: the copies started equal, so their layers' shapes are the shared network's)
    assert all(member.state_dict().keys() == shared.keys() for member in members)
    # a run with a network per group (env.groups) does not say which copy was which group: one line, no guess
    with pytest.raises(ConfigError, match="does not fit this actor"):
        load_network_weights(networks, tmp_path / "copies")


@pytest.mark.slow
@pytest.mark.usefixtures("ray_exclusive")
def test_rows_of_agents_on_ray_workers_reproduce_the_local_run(tmp_path):
    """Row mode on collector=ray (it asked the one env it keeps for spaces for 1 row, which a 2-agent env refused):
    2 workers x 4 rows give an 8-row local run's grouped weights and scalars."""
    from test_multiagent import scalars

    common = ["algo=ippo", "env=coop_match", "env.groups={a: [agent_0], b: [agent_1]}", "algo.groups.b.name=a2c",
              "train.total_steps=512", "train.test_every=256", "train.vector_mode=sync", *FAST]
    train(common, tmp_path / "local")
    train([*common, "collector=ray", "collector.workers=2", "collector.envs_per_worker=4"], tmp_path / "ray")
    assert_equal_state(final(tmp_path / "local")["algo"], final(tmp_path / "ray")["algo"], "algo")
    ray_scalars = {k: v for k, v in scalars(tmp_path / "ray").items() if not k.startswith("collector/")}
    assert ray_scalars == scalars(tmp_path / "local")


@pytest.mark.parametrize(("args", "message"), [
    ([*TAG, "algo.groups.prey.lr=1e-3"], "algo.groups.prey: env.groups has no group 'prey'; its groups: adversary, "
                                         "agent"),
    ([*TAG, "env.groups=null", "algo.groups.agent.lr=1e-3"],
     "algo.groups gives each group of env.groups an algorithm of its own: set env.groups (=prefix, or {a: "),
    ([*TAG, "env.agent_id=false", "algo.groups.agent.lr=1e-3"], "an algorithm of its own: set env.agent_id=true"),
    ([*TAG, "algo.groups.agent.lr=1e-3", "actor=lstm"], "algo.groups takes feed-forward networks"),
    (["algo=ppo", "env=CartPole-v1", "algo.groups.agent.lr=1e-3"], "it needs a multi-agent env"),
    ([*TAG, "algo.groups=agent"], "algo.groups='agent': a mapping {group: {setting: value}}"),
    ([*TAG, "algo.groups={agent: {lrr: 0.1}}"],
     "algo.groups.agent (ppo): unknown key 'algo.groups.agent.lrr' (did you mean 'algo.groups.agent.lr'?)"),
    # an off-policy run's groups: that line first, not env.joint's, which sent qmix users round in a loop
    (["algo=qmix", "env=simple_spread_v3", "env.groups=prefix", "algo.groups.agent.lr=1e-3"],
     "algo.groups gives each group an on-policy algorithm of its own on one rollout; algo=qmix is not one"),
    (["algo=qmix", "env=simple_spread_v3", "env.groups=prefix", "env.joint=false", "algo.groups.agent.lr=1e-3"],
     "algo=qmix is not one: choose from: a2c, pg, ppo"),
    (["algo=sac", "env=Pendulum-v1", "algo.groups.agent.lr=1e-3"], "algo=sac is not one"),
    # a group's schedule: the group's name checked (it named GroupedOnPolicy and listed every group's settings), and
    # a per-group schedule without algo.groups said as such
    ([*TAG, "algo.groups.agent.lr=1e-3", "algo.schedules.agnt.ent_coef=linear:0.01:0.0"],
     "algo.schedules.agnt.ent_coef: 'agnt' is not one of this run's groups (did you mean 'agent'?); its groups: "
     "adversary, agent (algo.schedules.ent_coef moves it in every group)"),
    ([*TAG, "algo.schedules.agent.ent_coef=linear:0.01:0.0"],
     "a schedule per group ('agent.') is for runs with algo.groups"),
])
def test_a_bad_grouped_run_is_one_line(args, message, tmp_path):
    pytest.importorskip("mpe2")
    done = forked_cli.run([*args, "train.total_steps=64", *QUIET, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr


def test_a_grouped_population_batches_each_group_and_names_a_group_that_cannot():
    """algo.groups members train as one population per group (sweeps/population/groups.py); a group whose algorithm
    cannot batch is named, so the launcher's warning says why its jobs run one at a time."""
    from rlcli.sweeps.population.groups import GroupedPopulation

    storages = [RolloutBuffer(STEPS, COPIES * N, (OWN + N,), (), True, torch.device("cpu")) for _ in range(2)]
    population = GroupedPopulation([grouped({}), grouped({})], storages)
    assert list(population.groups) == ["hunters", "prey"] and population.acting is None
    with pytest.raises(ConfigError) as error:
        GroupedPopulation([grouped({"prey": {"name": "trpo", "batch_size": 8}}) for _ in range(2)], storages)
    assert str(error.value) == ("algo.groups.prey.name=trpo cannot train in a population yet; a group on a2c, pg, "
                                "ppo and ppo_kl can")


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["env.normalize_obs=true", "algo.groups.agent.name=a2c"]],
                         ids=["ppo-groups", "normalized-a2c-group"])
def test_a_grouped_population_sweep_writes_what_the_basic_launcher_writes(extra, tmp_path):
    """Two seeds of a grouped simple_tag run (each group its own settings or algorithm) in one population: each
    member's networks, actions, rollout and test episodes are its single run's (the groups' shared normalizer too)."""
    from test_population import run
    from test_resume import final as last_checkpoint

    args = ["-m", *TAG, *FAST, "algo.groups.agent.ent_coef=0.01", "seed=0,1", "algo.lr=1e-3,3e-4",
            "train.total_steps=256", "train.test_every=128", *QUIET, "log.tensorboard=false", *extra]
    population = run(*args, "hydra/launcher=population", "hydra.launcher.n_jobs=1", "hydra.sweep.dir=pop",
                     cwd=tmp_path)
    assert population.returncode == 0, population.stderr[-3000:]
    assert "run one at a time" not in population.stdout + population.stderr
    basic = run(*args, "hydra.sweep.dir=basic", cwd=tmp_path)
    assert basic.returncode == 0, basic.stderr[-3000:]
    for job in map(str, range(4)):
        pop, bas = last_checkpoint(tmp_path / "pop" / job), last_checkpoint(tmp_path / "basic" / job)
        assert pop["state"]["env_steps"] == bas["state"]["env_steps"] == 256
        nets_a, nets_b = pop["algo"]["networks"], bas["algo"]["networks"]
        assert nets_a.keys() == nets_b.keys() and any(k.startswith("groups.agent.") for k in nets_a)
        assert all(torch.allclose(nets_a[k], nets_b[k], atol=1e-5) for k in nets_a), job
        assert np.array_equal(np.asarray(pop["buffer"]["actions"]), np.asarray(bas["buffer"]["actions"])), job
        tests = [(tmp_path / side / job / "eval.jsonl").read_text() for side in ("pop", "basic")]
        assert tests[0].count("\n") == tests[1].count("\n") == 2
        strip = [[{k: v for k, v in __import__("json").loads(line).items() if k != "wall_s"}
                  for line in text.splitlines()] for text in tests]
        assert strip[0] == strip[1], job


def test_jobs_that_differ_in_a_groups_batchable_values_share_a_population():
    """A sweep over a group's own lr or ent_coef batches as a sweep over the run's does; a group's other settings
    (n_epochs) start another population."""
    pytest.importorskip("mpe2")
    from rlcli.run.compose import compose_config, schedule_args
    from rlcli.sweeps.population.launch import group_jobs

    configs = [compose_config(schedule_args([*TAG, *more])) for more in
               (["seed=0", "algo.groups.agent.lr=1e-3"], ["seed=1", "algo.groups.agent.lr=3e-4"],
                ["seed=0", "algo.groups.agent.lr=1e-3", "algo.groups.agent.n_epochs=3"],
                ["seed=2", "algo.groups.agent.lr=1e-3", "algo.groups.adversary.ent_coef=0.02"])]
    assert group_jobs(configs, max_members=64) == [[0, 1, 3], [2]]
