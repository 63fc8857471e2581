"""env=pz with off-policy algorithms: independent learners sharing one network (IQL = DQN, ISAC = SAC, IDDPG = TD3)
on the same rows as IPPO, so the collector and the replay storage run unchanged. What they must get right: an agent
that ends before the others stores nothing after its end, a terminated agent's last step does not bootstrap and a
truncated one's does, and the reset step that follows the copy's episode is never a transition."""

import json
from pathlib import Path

import forked_cli
import numpy as np
import pytest
import torch
from test_resume import assert_equal_state

pytest.importorskip("pettingzoo")
from pettingzoo import ParallelEnv  # noqa: E402
from test_multiagent import QUIET, final, scalars, train  # noqa: E402

from rlcli.actors.normalizer import RunningNorm  # noqa: E402
from rlcli.buffers.replay import ReplayBuffer  # noqa: E402
from rlcli.collectors.local import Collector  # noqa: E402
from rlcli.contracts import ActOutput, OffPolicyLearner  # noqa: E402
from rlcli.envs.multiagent import ParallelVectorEnv  # noqa: E402

GAMMA = 0.5


class Scripted(ParallelEnv):  # type: ignore[misc]
    """Agents a and b; agent i's observation at step t of episode e is [e, t, i]. Step t pays a 10 + t and b 20 + t;
    b terminates after its 2nd step, a is truncated after its 4th (an agent done before the other, both flags)."""

    metadata = {"name": "scripted_v0", "render_modes": []}

    def __init__(self) -> None:
        import gymnasium as gym

        self.possible_agents = ["a", "b"]
        self.agents: list[str] = []
        self.episode, self.t = -1, 0
        self._obs = gym.spaces.Box(-1e3, 1e3, (3,), np.float32)
        self._act = gym.spaces.Discrete(4)

    def observation_space(self, agent):
        return self._obs

    def action_space(self, agent):
        return self._act

    def _observe(self, agents):
        return {a: np.array([self.episode, self.t, self.possible_agents.index(a)], np.float32) for a in agents}

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.episode, self.t = self.episode + 1, 0
        return self._observe(self.agents), {a: {} for a in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents), (actions, self.agents)  # nothing is sent for an agent that is gone
        rewards = {a: (10.0 if a == "a" else 20.0) + self.t for a in self.agents}
        self.t += 1
        terms = {a: a == "b" and self.t == 2 for a in self.agents}
        truncs = {a: a == "a" and self.t == 4 for a in self.agents}
        obs = self._observe(self.agents)
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, {a: {} for a in obs}


class ObsAction:
    """An off-policy algorithm's acting, enough for the collector: action = the step t of the row's observation."""

    steps_per_collect, episodes_per_collect, learning_starts, batch_size = 10, 0, 0, 1

    def act(self, obs, deterministic=False, state=None):
        actions = obs[:, 1].long() % 4
        return ActOutput(actions, torch.zeros(len(obs)), torch.zeros(len(obs)))

    def env_actions(self, actions):
        return actions

    def random_actions(self, n):
        raise AssertionError("no warm-up here")


def expected_transitions(n_step: int) -> set[tuple]:
    """(episode, agent, t, action, return, next t, discount) of both episodes, worked out by hand."""
    def obs(e, i, t):
        return (e, i, t)

    out = set()
    for e in (0, 1):
        if n_step == 1:
            out |= {(*obs(e, 0, t), t, 10.0 + t, t + 1, GAMMA) for t in range(4)}  # a: truncated, bootstraps
            out |= {(*obs(e, 1, 0), 0, 20.0, 1, GAMMA), (*obs(e, 1, 1), 1, 21.0, 2, 0.0)}  # b: terminated at 2
        else:  # 2-step returns, shorter ones where the agent's episode ends
            out |= {(*obs(e, 0, t), t, 10.0 + t + GAMMA * (11.0 + t), t + 2, GAMMA**2) for t in range(3)}
            out.add((*obs(e, 0, 3), 3, 13.0, 4, GAMMA))
            out |= {(*obs(e, 1, 0), 0, 20.0 + GAMMA * 21.0, 2, 0.0), (*obs(e, 1, 1), 1, 21.0, 2, 0.0)}
    return out


@pytest.mark.parametrize("n_step", [1, 2])
def test_a_replay_of_a_hand_made_episode_stores_exactly_its_transitions(n_step):
    """Two episodes of 4 steps and their reset steps (10 steps of 2 rows): per episode a's 4 transitions (the last
    one truncated, so it bootstraps from a's final observation) and b's 2 (the last one terminated: discount 0),
    nothing of b's row after it ended, nothing of the reset steps."""
    envs = ParallelVectorEnv([Scripted()], "scripted", None, agent_id=False, critic_state=False)
    buffer = ReplayBuffer(100, n_step, num_envs=2, obs_shape=(3,), action_shape=(), discrete=True,
                          device=torch.device("cpu"), gamma=GAMMA)
    collector = Collector(envs, RunningNorm((3,), enabled=False), torch.device("cpu"), seed=0)
    stats = collector.collect(OffPolicyLearner(ObsAction(), buffer))  # type: ignore[arg-type]
    n = len(buffer)
    stored = {(*(int(x) for x in o[[0, 2, 1]]), int(a), float(r), int(no[1]), float(d))
              for o, a, r, no, d in zip(buffer.obs[:n], buffer.actions[:n], buffer.rewards[:n], buffer.next_obs[:n],
                                        buffer.discounts[:n], strict=True)}
    assert n == 12 and stored == expected_transitions(n_step)
    assert all(buffer.next_obs[i, 0] == buffer.obs[i, 0] for i in range(n))  # no transition crosses a reset
    assert stats.transitions == 12 and stats.steps == 20
    assert stats.episode_returns == [46.0 + 41.0] * 2  # the team sum, per episode
    assert stats.agent_episodes == {"a": [46.0, 46.0], "b": [41.0, 41.0]}


# ------------------------------------------------------------------------------------------ runs of rl-train


def test_iql_learns_the_cooperative_toy(tmp_path):
    """Independent Q-learning (algo=dqn on env=pz): one Q-network shared by both agents, told apart by the agent
    one-hot. Random play earns about 2.2 of 20; measured: 20.0 at 1,000 env steps (seed 3, ~3 s of training)."""
    run_dir = tmp_path / "iql"
    train(["algo=dqn", "env=coop_match", "seed=3", "train.total_steps=2000", "train.test_every=1000",
           "train.test_episodes=10", "algo.lr=1e-3", "algo.gamma=0.5", "algo.learning_starts=200",
           "algo.target_update_interval=200", "algo.exploration_fraction=0.3", "algo.batch_size=64",
           "algo.train_freq=1"], run_dir)
    records = [json.loads(line) for line in (run_dir / "eval.jsonl").open()]
    assert [r["env_steps"] for r in records] == [1000, 2000]
    assert np.mean(records[-1]["returns"]) >= 18, records
    agents = records[-1]["agent_returns"]
    assert records[-1]["returns"] == [a + b for a, b in zip(agents["agent_0"], agents["agent_1"], strict=True)]
    # the training returns too: each agent's mean over the same last 100 episodes as the team's, so they add up
    tags = scalars(run_dir)
    team, first, second = (dict(tags[f"rollout/return_{key}"]) for key in ("mean", "agent_0", "agent_1"))
    common = sorted(team.keys() & first.keys() & second.keys())
    assert len(common) >= 10 and all(team[s] == pytest.approx(first[s] + second[s], abs=1e-4) for s in common)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_shared_isac_and_iddpg_on_independent_copies_are_the_single_agent_runs_with_twice_the_envs(algo, tmp_path):
    """As the IPPO test in test_multiagent.py, off-policy: two agents each in its own Pendulum, no one-hot. Copy c's
    agent i is env 2c + i of the single-agent run (same seeds, same random warm-up actions, the same rows stored in
    the same order), so the replay, the networks and every loss are the same, bit for bit."""
    common = [f"algo={algo}", "algo.learning_starts=200", "algo.batch_size=32", "train.num_envs=4",
              "train.total_steps=400", "train.test_every=0", "train.vector_mode=sync", "actor.hidden_sizes=[32,32]"]
    train([*common, "env=gym", "env.id=Pendulum-v1", "env.max_episode_steps=50"], tmp_path / "single")
    train([*common, "env=pz", "env.id=rlcli.envs.pz_toys:gym_copies", "+env.kwargs.env_id=Pendulum-v1",
           "+env.kwargs.agents=2", "+env.kwargs.max_episode_steps=50", "env.agent_id=false"], tmp_path / "agents")
    single, agents = final(tmp_path / "single"), final(tmp_path / "agents")
    assert_equal_state(single["algo"], agents["algo"], "algo")
    assert_equal_state(single["buffer"], agents["buffer"], "buffer")
    a, b = scalars(tmp_path / "single"), scalars(tmp_path / "agents")
    losses = [tag for tag in a if tag.startswith("train/")]
    assert len(losses) >= 2 and all(a[tag] == b[tag] for tag in losses), losses


def mpe_run(tmp_path: Path, algo: str, *extra: str):
    pytest.importorskip("mpe2")
    return forked_cli.run([f"algo={algo}", "env=simple_spread_v3", "env.kwargs.continuous_actions=true",
                           "train.num_envs=6", *extra, *QUIET, f"hydra.run.dir={tmp_path / algo}"], tmp_path)


@pytest.mark.parametrize(("algo", "extra", "message"), [
    ("dqn", ["env.kwargs.continuous_actions=true"],
     "algo=dqn cannot handle Box actions of env mpe2.simple_spread_v3; it supports: Discrete"),
    ("sac", [], "algo=sac cannot handle Discrete actions of env mpe2.simple_spread_v3; it supports: Box"),
    ("dqn", ["env.critic_state=true"], "env.critic_state=true gives the centralized critic of algo=mappo"),
    ("sac", ["env.kwargs.continuous_actions=true", "env.critic_state=true"],
     "env.critic_state=true gives the centralized critic of algo=mappo"),
])
def test_an_algorithm_that_cannot_take_the_agents_is_one_line(algo, extra, message, tmp_path):
    pytest.importorskip("mpe2")
    done = forked_cli.run([f"algo={algo}", "env=simple_spread_v3", "train.num_envs=6", "train.total_steps=60",
                           "algo.learning_starts=12", *extra, *QUIET, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], done.stderr


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_isac_and_iddpg_train_on_continuous_simple_spread(algo, tmp_path):
    """mpe2's simple_spread with continuous actions (Box(0, 1, (5,)) per agent): the runs go through, with team and
    per-agent returns in eval.jsonl."""
    done = mpe_run(tmp_path, algo, "train.total_steps=600", "algo.learning_starts=300", "train.test_every=600",
                   "train.test_episodes=2", "actor.hidden_sizes=[32,32]")
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / algo / "eval.jsonl").read_text().splitlines()[-1])
    assert list(record["agent_returns"]) == ["agent_0", "agent_1", "agent_2"] and record["lengths"] == [25, 25]
    assert record["returns"] == pytest.approx([sum(r) for r in zip(*record["agent_returns"].values(), strict=True)])
