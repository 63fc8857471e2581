"""algo=masac and algo=maddpg: a team's shared policy and a centralized critic on env=pz's joint mode with continuous
actions (algos/centralized_critic.py). The critic's TD target against a hand-written reference, the joint adapter's
continuous layout, a learning run on the cooperative toy and the one-line errors (exact resume: test_resume.py's
masac- and maddpg-coop_reach-joint cases)."""

import json

import forked_cli
import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo")
from pettingzoo.test import parallel_api_test  # noqa: E402
from test_multiagent import QUIET, train  # noqa: E402

from rlcli.actors.normalizer import RunningNorm  # noqa: E402
from rlcli.actors.offpolicy import NetworkRecipe  # noqa: E402
from rlcli.algos.centralized_critic import MADDPG, MASAC  # noqa: E402
from rlcli.envs.multiagent import JointBox, ParallelVectorEnv  # noqa: E402
from rlcli.envs.pz_toys import CoopReach  # noqa: E402


def joint_env(copies=2, **kwargs):
    return ParallelVectorEnv([CoopReach(**kwargs) for _ in range(copies)], "coop_reach", None, agent_id=True,
                             critic_state=False, joint=True)


def recipe(obs_dim):
    return NetworkRecipe(obs_dim=obs_dim, hidden_sizes=[16, 16], activation="relu", ortho_init=False,
                         normalizer=RunningNorm((obs_dim,), enabled=False))


# ----------------------------------------------------------------------------------------------- the adapter


def test_the_toy_passes_pettingzoos_api_test_and_the_joint_layout_is_a_box_per_agent():
    parallel_api_test(CoopReach(), num_cycles=30)
    vec = joint_env()
    space = vec.single_action_space
    assert isinstance(space, JointBox) and space.shape == (2, 1) and (space.n_agents, space.action_dim) == (2, 1)
    # each agent's line: own obs (1), one-hot (2), active (1), global state (2)
    assert vec.single_observation_space.shape == (2, 1 + 2 + 1 + 2) and space.agent_size == 3
    obs, _ = vec.reset(seed=4)
    cues = [env.cue for env in vec.copies]
    assert np.allclose(obs[:, :, 0], np.array(cues)[:, None])  # both agents see their copy's cue
    assert np.array_equal(obs[0, :, 1:3], np.eye(2)) and obs[:, :, 3].all()
    assert np.allclose(obs[:, :, 4], np.array(cues)[:, None])  # the state: the cue, then t / max_cycles
    right = np.array([[[c], [-c]] for c in cues], np.float32)
    wrong = np.zeros((2, 2, 1), np.float32)
    _, rewards, term, trunc, _ = vec.step(np.stack([right[0], wrong[1]]))
    # the team reward: both agents' (equal) rewards summed, never divided
    assert rewards[0] == pytest.approx(0.0, abs=1e-6) and rewards[1] == pytest.approx(-2 * 2 * cues[1] ** 2, rel=1e-5)
    assert not (term.any() or trunc.any())


# ------------------------------------------------------------------------------------ the losses, by hand


def batch_of(vec, rows=5, seed=0):
    rng = np.random.default_rng(seed)
    shape = vec.single_observation_space.shape
    obs = torch.tensor(rng.uniform(-1, 1, (rows, *shape)), dtype=torch.float32)
    next_obs = torch.tensor(rng.uniform(-1, 1, (rows, *shape)), dtype=torch.float32)
    active = vec.single_action_space.agent_size
    obs[:, :, active] = 1.0
    next_obs[:, :, active] = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 0.0]])[:rows]
    obs[:, :, active + 1:] = obs[:, :1, active + 1:]  # the same global state on every line
    next_obs[:, :, active + 1:] = next_obs[:, :1, active + 1:]

    class Batch:
        pass

    batch = Batch()
    batch.obs, batch.next_obs = obs, next_obs
    batch.actions = torch.tensor(rng.uniform(-1, 1, (rows, 2, 1)), dtype=torch.float32)
    batch.rewards = torch.tensor(rng.normal(size=rows), dtype=torch.float32)
    batch.discounts = torch.tensor([0.9, 0.9, 0.0, 0.9, 0.9])[:rows]
    batch.weights = torch.ones(rows)
    return batch


def critic_by_hand(critic, obs, actions):
    """One critic's Q: the global state of agent 0's line, then each agent's action, zero where it is inactive."""
    state = obs[:, 0, 4:]
    joint = torch.cat([actions[:, i] * obs[:, i, 3:4] for i in range(2)], -1)
    return critic(state, joint)


def test_masac_critic_loss_is_the_soft_target_over_the_team(monkeypatch):
    vec = joint_env()
    algo = MASAC(recipe(int(np.prod(vec.single_observation_space.shape))), vec.single_action_space, 2,
                 learning_starts=0, batch_size=5)
    batch = batch_of(vec)
    alpha = torch.tensor(0.3)
    noise = torch.randn(5, 2, 1)
    loss, errors = algo.soft_td_loss(batch, alpha, noise)
    net = algo.networks
    # the policy by hand: agent i's line (own obs and one-hot), its tanh-Gaussian with the given draws
    params = net.policy.agent.net(batch.next_obs[:, :, :3])
    mean, log_std = params.chunk(2, -1)
    log_std = log_std.clamp(-20, 2)
    u = mean + log_std.exp() * noise
    next_actions = torch.tanh(u)
    per_agent = (torch.distributions.Normal(mean, log_std.exp()).log_prob(u)
                 - 2 * (np.log(2) - u - torch.nn.functional.softplus(-2 * u))).sum(-1)  # log(1 - tanh(u)^2)
    team_log_prob = (per_agent * batch.next_obs[:, :, 3]).sum(-1)  # inactive agents' terms dropped
    next_q = torch.stack([critic_by_hand(q, batch.next_obs, next_actions) for q in net.critics_target.critics.nets])
    target = batch.rewards + batch.discounts * (next_q.min(0).values - alpha * team_log_prob)
    qs = torch.stack([critic_by_hand(q, batch.obs, batch.actions) for q in net.critics.critics.nets])
    expected = 0.5 * (qs - target).square().mean(-1).sum()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-4, abs=1e-5)
    assert torch.allclose(errors, (qs - target).abs().mean(0).detach(), atol=1e-4)


def test_maddpg_critic_loss_is_the_target_policy_team_value():
    vec = joint_env()
    algo = MADDPG(recipe(int(np.prod(vec.single_observation_space.shape))), vec.single_action_space, 2,
                  learning_starts=0, batch_size=5, gamma=0.9)
    batch = batch_of(vec, seed=1)
    loss, (errors, q_mean) = algo.critic_loss(batch)
    net = algo.networks
    next_actions = torch.tanh(net.policy_target.agent.net(batch.next_obs[:, :, :3]))
    target = batch.rewards + batch.discounts * critic_by_hand(net.critics_target.critics.nets[0], batch.next_obs,
                                                              next_actions)
    q = critic_by_hand(net.critics.critics.nets[0], batch.obs, batch.actions)
    assert loss.item() == pytest.approx((q - target).square().mean().item(), rel=1e-4, abs=1e-5)
    # an inactive agent's action does not move the critic
    moved = batch.actions.clone()
    moved[:, 1] = 0.5
    inactive = batch.obs.clone()
    inactive[:, 1, 3] = 0.0
    assert torch.equal(net.critics(inactive, batch.actions), net.critics(inactive, moved))


# ------------------------------------------------------------------------------------------ runs of rl-train


@pytest.mark.parametrize("algo", ["masac", "maddpg"])
def test_the_centralized_critics_learn_the_cooperative_toy(algo, tmp_path):
    """Random play earns about -26.6 a 10-step episode (the team sum of both agents' rewards); the best is 0.
    Measured (4 copies, 1,500 env steps, ~10 s a run): MASAC -0.52, MADDPG -0.25 over 10 test episodes."""
    run_dir = tmp_path / algo
    train([f"algo={algo}", "env=coop_reach", "seed=0", "train.num_envs=4", "train.total_steps=1500",
           "train.test_every=1500", "train.test_episodes=10", "algo.learning_starts=200", "algo.batch_size=64",
           "actor.hidden_sizes=[32,32]", "algo.lr=3e-3"], run_dir)
    record = json.loads((run_dir / "eval.jsonl").read_text().splitlines()[-1])
    assert record["env_steps"] == 1500
    assert np.mean(record["returns"]) >= -5, record
    agents = record["agent_returns"]
    assert record["returns"] == pytest.approx([a + b for a, b in zip(agents["agent_0"], agents["agent_1"],
                                                                      strict=True)])
    # the trained team acts on PettingZoo's dict, each agent from its line of one joint observation
    import rlcli

    policy, env = rlcli.load(run_dir), CoopReach()
    obs, _ = env.reset(seed=11)
    team = 0.0
    while env.agents:
        actions, _ = policy.predict({a: obs[a] for a in env.agents})
        assert set(actions) == set(env.agents) and all(a.shape == (1,) for a in actions.values())
        obs, rewards, *_ = env.step(actions)
        team += sum(rewards.values())
    assert team >= -5


@pytest.mark.parametrize(("overrides", "message"), [
    (["algo=masac", "env=coop_match"],
     "algo=masac takes continuous (Box) actions; this env's agents act with Discrete ones"),
    (["algo=maddpg", "env=coop_reach", "env.joint=false"],
     "algo=maddpg learns from a team's joint transitions, and env.joint=false gives one row per agent: use "
     "env.joint=true"),
    (["algo=masac", "env=gym", "env.id=Pendulum-v1"],
     "env.joint=true (algo=vdn, qmix, masac, maddpg: a team's joint transitions) needs a multi-agent env; env "
     "Pendulum-v1 has one agent"),
    (["algo=masac", "env=coop_reach", "env.normalize_obs=true"], "env.normalize_obs"),
])
def test_a_masac_or_maddpg_mistake_is_one_line(overrides, message, tmp_path):
    done = forked_cli.run([*overrides, "train.total_steps=50", *QUIET, f"hydra.run.dir={tmp_path / 'run'}"],
                          tmp_path)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], done.stderr


@pytest.mark.parametrize("copies", [1, 3])
def test_joint_mode_makes_train_num_envs_copies(copies):
    """train.num_envs counts copies in joint mode (one row each), not agents; any count, one included (a collector=ray
    run's learner builds one copy to read the spaces)."""
    from rlcli.registry import ENVS

    envs = ENVS.build({"name": "pz", "id": "rlcli.envs.pz_toys:coop_reach", "joint": True}).make(copies)
    try:
        assert envs.num_envs == copies and len(envs.copies) == copies
        assert envs.single_action_space.shape == (2, 1)
    finally:
        envs.close()


def test_maddpg_with_ornstein_uhlenbeck_noise_on_three_copies_runs(tmp_path):
    """The exploration noise's state is per copy and per agent: [copies, agents x action]."""
    run_dir = tmp_path / "ou"
    train(["algo=maddpg", "env=coop_reach", "train.num_envs=3", "algo.noise=ornstein_uhlenbeck",
           "algo.learning_starts=30", "algo.batch_size=16", "actor.hidden_sizes=[16,16]", "train.total_steps=90",
           "train.test_every=0"], run_dir)
    assert (run_dir / "checkpoints").is_dir()
