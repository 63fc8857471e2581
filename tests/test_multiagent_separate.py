"""env.share_params=false: each agent of a multi-agent group has its own networks (actors/per_agent.py). A row
goes through its agent's copy and no other (checked against standalone copies, outputs and gradients); a group of
one agent trains bit for bit as with shared parameters; IPPO learns the cooperative toy; an exact resume; rl-eval and
rlcli.load(...).predict on such a run; bad settings as one line."""

import copy
import dataclasses
import json

import forked_cli
import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo")
from test_multiagent import QUIET, train  # noqa: E402
from test_resume import assert_equal_state, assert_sigterm_then_resume_is_exact, final, scalars  # noqa: E402

from rlcli.actors.offpolicy import Critics, QNetwork  # noqa: E402
from rlcli.actors.per_agent import PerAgentActorCritic  # noqa: E402
from rlcli.envs.multiagent import SeparateAgents  # noqa: E402
from rlcli.envs.pz_toys import CoopMatch  # noqa: E402
from rlcli.registry import ACTORS, ENVS, ConfigError  # noqa: E402

OWN, N, ROWS = 4, 3, 24
FAST = ["train.num_envs=8", "algo.n_steps=16", "algo.batch_size=32", "algo.n_epochs=2", "train.test_episodes=4",
        "actor.hidden_sizes=[16,16]", "torch_threads=1"]


def row_space(joint: bool = False) -> gym.spaces.Box:
    """A row of an env=pz group of N agents: OWN inputs, then the agent's one-hot (joint: N such lines)."""
    shape = (N, OWN + N) if joint else (OWN + N,)
    space = gym.spaces.Box(-np.inf, np.inf, shape, np.float32)
    space.separate_agents = SeparateAgents(N, None if joint else OWN, joint)  # what env.share_params=false sets
    return space


def rows(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """ROWS rows in shuffled agent order (as a minibatch holds them) and each row's agent."""
    g = torch.Generator().manual_seed(seed)
    agent = torch.randperm(ROWS, generator=g) % N
    obs = torch.cat([torch.randn(ROWS, OWN, generator=g), torch.nn.functional.one_hot(agent, N).float()], -1)
    return obs, agent


def build(action_space: gym.spaces.Space, heads: str = "actor_critic", joint: bool = False):
    torch.manual_seed(0)
    return ACTORS.build({"name": "mlp", "hidden_sizes": [8, 8]}, observation_space=row_space(joint),
                        action_space=action_space, heads=heads)


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    # a copy computes every row and keeps its agent's: the same arithmetic per row as the standalone copy on its
    # own rows, up to how the matrix product blocks a different number of rows
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def grads(module: torch.nn.Module) -> list[torch.Tensor]:
    return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in module.parameters()]


@pytest.mark.parametrize("action_space", [gym.spaces.Discrete(3), gym.spaces.Box(-1.0, 1.0, (2,), np.float32)],
                         ids=["discrete", "box"])
def test_each_row_goes_through_its_agents_own_actor_critic_and_no_other(action_space):
    """The wrapped network's log-probs, entropies and values on agent i's rows are a standalone copy of agent i's
    network's (its own Gaussian log std too), and so are the gradients of a loss over all rows; a loss over agent
    0's rows alone leaves exactly zero gradient on the other agents' copies."""
    net = build(action_space)
    assert isinstance(net, PerAgentActorCritic) and len(net.members) == N
    standalone = [copy.deepcopy(member) for member in net.members]  # separate nn.Modules, agent i's weights
    obs, agent = rows()
    with torch.no_grad():
        actions = net.act(obs).actions
    out = net.evaluate(obs, actions)
    loss = (out.log_probs * torch.arange(ROWS) + out.values.square() + out.entropy).sum()
    loss.backward()
    for i, ref in enumerate(standalone):
        mine = agent == i
        expected = ref.evaluate(obs[mine], actions[mine])
        for got, want in zip(out, expected, strict=True):
            close(got[mine], want)
        (expected.log_probs * torch.arange(ROWS)[mine] + expected.values.square() + expected.entropy).sum().backward()
        for got, want in zip(grads(net.members[i]), grads(ref), strict=True):
            close(got, want)
    net.zero_grad(set_to_none=True)
    out = net.evaluate(obs, actions)
    (out.log_probs + out.values)[agent == 0].sum().backward()
    assert all(g.abs().sum() > 0 for g in grads(net.members[0])[:2])
    assert all(torch.equal(g, torch.zeros_like(g)) for i in (1, 2) for g in grads(net.members[i]))
    # acting and the value the rollout bootstraps from are the copies' too
    with torch.no_grad():
        close(net.value(obs)[agent == 2], standalone[2].value(obs[agent == 2]))
        close(net.policy_params(obs)[agent == 1][..., :2], standalone[1].policy_params(obs[agent == 1])[..., :2])


def test_a_rows_agent_is_read_from_its_one_hot_under_observation_normalization_too():
    """env.normalize_obs=true rescales the one-hot columns as any other input; the row's own column stays the
    largest (1 is above a column's running mean, 0 below), so the agent read from it is the same."""
    from rlcli.actors.normalizer import RunningNorm
    from rlcli.actors.per_agent import agent_index

    obs, agent = rows(3)
    norm = RunningNorm((OWN + N,), clip=5.0)
    assert torch.equal(agent_index(norm(obs), OWN, N), agent)  # before any statistics
    norm.update(obs)
    normalized = norm(obs)
    assert not torch.equal(normalized[:, OWN:], obs[:, OWN:])
    assert torch.equal(agent_index(normalized, OWN, N), agent)


@pytest.mark.parametrize("dueling", [False, True])
def test_dqn_q_networks_route_rows_by_agent_and_joint_mode_by_the_agent_axis(dueling):
    """Row mode (algo=dqn on env=pz: independent Q-learners): agent i's rows get agent i's Q-values and gradient.
    Joint mode (algo=vdn, qmix: [batch, agents, inputs]): agent i's line goes through copy i."""
    q = QNetwork(build(gym.spaces.Discrete(3), "recipe"), 3, dueling)
    members = q.agents.members
    standalone = [copy.deepcopy(m) for m in members]
    obs, agent = rows(1)
    values = q(obs)
    (values * torch.arange(3.0)).sum().backward()
    for i, ref in enumerate(standalone):
        want = ref(obs[agent == i])
        close(values[agent == i], want)
        (want * torch.arange(3.0)).sum().backward()
        for got, expected in zip(grads(members[i]), grads(ref), strict=True):
            close(got, expected)

    recipe = build(gym.spaces.Discrete(3), "recipe", joint=True)
    joint = QNetwork(dataclasses.replace(recipe, obs_dim=OWN + N), 3, dueling)  # as algo=vdn builds its agents
    lines = torch.randn(5, N, OWN + N)
    out = joint(lines)
    assert out.shape == (5, N, 3)
    for i, member in enumerate(joint.agents.members):
        assert torch.equal(out[:, i], member(lines[:, i]))


def test_row_mode_critics_are_per_agent_and_joint_mode_critics_one_network():
    obs, agent = rows(2)
    actions = torch.randn(ROWS, 2)
    critics = Critics(build(gym.spaces.Box(-1, 1, (2,)), "recipe"), 2, 2)
    q = critics(obs, actions)
    assert q.shape == (2, ROWS)
    for c, net in enumerate(critics.nets):
        for i, member in enumerate(net.members):
            close(q[c, agent == i], member(obs[agent == i], actions[agent == i]))
    centralized = Critics(build(gym.spaces.Box(-1, 1, (2,)), "recipe", joint=True), 2, 2)
    assert all(isinstance(net, torch.nn.Module) and not hasattr(net, "members") for net in centralized.nets)


@pytest.mark.slow
def test_a_one_agent_group_trains_bit_identically_with_shared_and_separate_parameters(tmp_path):
    """With one agent in the group (env.agents=[agent_0]) the separate-parameter network is one copy, built from the
    same random numbers as the shared one, and every row is its own: the same weights, optimizer state and logged
    scalars, bit for bit (not merely to float tolerance: no arithmetic differs)."""
    common = ["algo=ippo", "env=coop_match", "env.agents=[agent_0]", "train.total_steps=256", "train.test_every=128",
              *FAST]
    train(common, tmp_path / "shared")
    train([*common, "env.share_params=false"], tmp_path / "separate")
    shared, separate = final(tmp_path / "shared")["algo"], final(tmp_path / "separate")["algo"]
    assert separate["networks"].keys() == {f"members.0.{k}" for k in shared["networks"]}
    assert_equal_state(shared["networks"], {k.removeprefix("members.0."): v
                                            for k, v in separate["networks"].items()}, "networks")
    assert_equal_state(shared["optimizer"], separate["optimizer"], "optimizer")
    assert scalars(tmp_path / "shared") == scalars(tmp_path / "separate")


@pytest.mark.slow
def test_ippo_with_separate_parameters_learns_the_toy_and_rl_eval_and_predict_read_the_run(tmp_path):
    """Random play earns about 2.2 of 20: each agent must answer the same cue its own way. Measured: 20.0 at the
    test after 2,048 env steps (seed 3). rl-eval, export and predict (PettingZoo's dict) read the run."""
    run_dir = tmp_path / "ippo"
    train(["algo=ippo", "env=coop_match", "env.share_params=false", "train.total_steps=2048",
           "train.test_every=2048", "seed=3", "algo.lr=1e-3", "algo.gamma=0.5", *FAST, "algo.n_epochs=4",
           "train.test_episodes=10", "actor.hidden_sizes=[64,64]"], run_dir)
    record = json.loads((run_dir / "eval.jsonl").read_text().splitlines()[-1])
    assert record["env_steps"] == 2048 and np.mean(record["returns"]) >= 18, record
    done = forked_cli.run([str(run_dir), "episodes=3"], tmp_path, program="rl-eval")
    assert done.returncode == 0, done.stderr
    assert "agent_0" in done.stdout
    done = forked_cli.run([str(run_dir), "export=torchscript"], tmp_path, program="rl-eval")
    assert done.returncode == 0, done.stderr
    assert "actions differ from rlcli's by at most 0 on" in done.stdout, done.stdout
    import rlcli

    policy, env = rlcli.load(run_dir), CoopMatch()
    obs, _ = env.reset(seed=11)
    team = 0.0
    while env.agents:
        actions, _ = policy.predict({a: obs[a] for a in env.agents}, deterministic=True)
        assert set(actions) == set(env.agents)
        obs, rewards, *_ = env.step(actions)
        team += sum(rewards.values())
    assert team >= 18


@pytest.mark.slow
def test_a_separate_parameter_mappo_run_stopped_after_a_checkpoint_resumes_bit_identically(tmp_path):
    args = ["algo=mappo", "env=coop_match", "env.share_params=false", "train.total_steps=1024",
            "train.checkpoint_every=256", "train.test_every=512", "train.log_every=128", *FAST, *QUIET]
    assert_sigterm_then_resume_is_exact(args, 1024, tmp_path)


def test_turn_based_players_get_their_own_networks_and_act_among_the_legal_moves():
    """A turn-based (AEC) game's players are rows with a one-hot too (envs/turn_based.py): with separate parameters
    each player (seat) has its own network, masked acting included."""
    pytest.importorskip("pettingzoo.classic")
    factory = ENVS.build({"name": "pz", "id": "pettingzoo.classic.tictactoe_v3", "share_params": False})
    envs = factory.make(4, masks=True)
    space = envs.single_observation_space
    assert space.separate_agents == SeparateAgents(2, space.shape[0] - 2, False)
    net = ACTORS.build({"name": "mlp", "hidden_sizes": [8]}, observation_space=space,
                       action_space=envs.single_action_space, heads="actor_critic")
    assert isinstance(net, PerAgentActorCritic) and len(net.members) == 2
    obs = torch.as_tensor(envs.reset(seed=0)[0])
    mask = torch.zeros(4, 9, dtype=torch.bool)
    mask[:, 4] = True
    assert net.act(obs, action_mask=mask).actions.tolist() == [4, 4, 4, 4]
    envs.close()


def test_separate_parameters_without_the_agent_one_hot_are_one_line():
    with pytest.raises(ConfigError) as error:
        ENVS.build({"name": "pz", "id": "rlcli.envs.pz_toys:coop_match", "agent_id": False, "share_params": False})
    assert str(error.value) == ("env.share_params=false gives each agent its own network and finds a row's agent by "
                                "its one-hot index: set env.agent_id=true (or env.share_params=true)")
    # joint mode has the agent axis, and needs no one-hot
    ENVS.build({"name": "pz", "id": "rlcli.envs.pz_toys:coop_match", "agent_id": False, "share_params": False,
                "joint": True})


@pytest.mark.parametrize(("args", "message"), [
    (["algo=ppo", "env=CartPole-v1", "env.share_params=false"], "unknown key 'env.share_params'; valid keys: "),
    (["algo=ippo", "env=coop_match", "env.share_params=false", "actor=lstm"],
     "env.share_params=false gives each agent its own actor=mlp network; actor=lstm has no per-agent version: use "
     "actor=mlp, or env.share_params=true"),
    (["algo=pqn", "env=coop_match", "env.share_params=false"],
     "env.share_params=false: algo=pqn builds its own networks, which have no per-agent version; use "
     "env.share_params=true"),
], ids=["single-agent-env", "recurrent-actor", "algo-without-per-agent-networks"])
def test_bad_separate_parameter_settings_are_one_line(args, message, tmp_path):
    done = forked_cli.run([*args, "train.total_steps=64", *QUIET, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], done.stderr
