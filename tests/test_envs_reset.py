"""Replays whose envs are reset in mid-episode (a resume that could not restore the envs, a restarted Ray worker):
what each was still gathering for those envs never joins the next episode's steps."""

import numpy as np
import torch

from rlcli.buffers.her import HerReplayBuffer
from rlcli.buffers.replay import ReplayBuffer
from rlcli.buffers.sequence import SequenceReplayBuffer
from rlcli.envs import GymEnvFactory

CPU = torch.device("cpu")


def n_step_add(buffer: ReplayBuffer, t: int, reward: float, done: bool = False) -> None:
    """One step of one env: observation t, action 0, `reward`, next observation t + 1."""
    buffer.add(torch.tensor([[float(t)]]), torch.tensor([0]), np.array([reward]), np.array([[t + 1.0]]),
               np.array([False]), np.array([done]), np.array([True]))


def test_n_step_returns_after_a_reset_hold_only_the_new_episodes_rewards():
    gamma = 0.5
    buffer = ReplayBuffer(100, 3, num_envs=1, obs_shape=(1,), action_shape=(), discrete=True, device=CPU, gamma=gamma)
    n_step_add(buffer, 0, 1.0)
    n_step_add(buffer, 1, 2.0)  # two steps still gathering their 3-step returns
    buffer.envs_reset([0])
    for t, reward in [(10, 4.0), (11, 8.0), (12, 16.0)]:  # the new episode's first three steps
        n_step_add(buffer, t, reward)
    assert len(buffer) == 1  # only the new episode's first step has its three rewards
    assert buffer.obs[0].item() == 10.0 and buffer.next_obs[0].item() == 13.0
    assert buffer.rewards[0].item() == 4.0 + gamma * 8.0 + gamma**2 * 16.0  # a plain reference
    assert abs(buffer.discounts[0].item() - gamma**3) < 1e-7


def test_a_sequence_step_before_a_reset_is_not_learned_from_and_the_next_one_starts_an_episode():
    buffer = SequenceReplayBuffer(capacity=100, seq_len=5, burn_in=0, sequence_overlap=0.0, num_envs=2,
                                  obs_shape=(1,), carry_size=3, device=CPU)

    def add(t: int, starts: list[float]) -> None:
        obs = torch.tensor([[float(t)], [100.0 + t]])
        buffer.add(obs, torch.zeros(2, dtype=torch.long), np.full(2, float(t)), obs.numpy() + 1, np.zeros(2),
                   np.zeros(2, bool), np.ones(2, bool), torch.tensor(starts), torch.zeros(2, 3))

    add(0, [1.0, 1.0])
    add(1, [0.0, 0.0])
    add(2, [0.0, 0.0])
    buffer.envs_reset([0])  # env 0 only: env 1 goes on with its episode
    add(3, [1.0, 0.0])  # env 0's new episode begins
    add(4, [0.0, 0.0])
    assert len(buffer) == 2
    row = {int(buffer.obs[k, 0, 0]): k for k in range(2)}
    assert buffer.valid[row[0]].tolist() == [1, 1, 0, 1, 1]  # step 2's next observation is another episode's
    assert buffer.valid[row[100]].tolist() == [1, 1, 1, 1, 1]
    # every sequence: an episode starts only after a step that is not learned from
    starts, valid = buffer.starts[:2, 1:-1], buffer.valid[:2, :-1]
    assert not ((starts == 1) & (valid == 1)).any()


def test_her_writes_the_episode_a_reset_cut_short_and_starts_the_next_on_its_own():
    factory = GymEnvFactory("BitFlipping-v0", kwargs={"n_bits": 4})
    buffer = HerReplayBuffer(100, 4, "future", num_envs=1, obs_shape=(12,), action_shape=(), discrete=True,
                             device=CPU, gamma=0.9, goal=factory.goal)

    def add(t: int, done: bool = False) -> None:
        obs = np.full((1, 12), float(t), np.float32)
        buffer.add(torch.as_tensor(obs), torch.tensor([0]), np.array([-1.0]), obs + 1, np.array([False]),
                   np.array([done]), np.array([True]))

    add(0)
    add(1)
    buffer.envs_reset([0])
    assert len(buffer) == 2 and buffer.ep_start[:2].tolist() == [0, 0] and buffer.ep_end[:2].tolist() == [1, 1]
    add(5)
    add(6, done=True)
    assert len(buffer) == 4 and buffer.ep_start[2:4].tolist() == [2, 2] and buffer.ep_end[2:4].tolist() == [3, 3]


def test_a_resume_that_cannot_restore_the_envs_tells_the_replay_which_were_reset(tmp_path, monkeypatch):
    """The collector's envs reset on resume (async vector envs: their state cannot be read): the replay drops
    what it was gathering for every env, as the Ray collector's restarted worker tells it for its envs."""
    from rlcli.run.build import build
    from rlcli.run.compose import compose_config
    from rlcli.run.state import TrainState, restore, save

    monkeypatch.chdir(tmp_path)
    cfg = compose_config(["algo=dqn", "env=CartPole-v1", "train.num_envs=2", "buffer.n_step=3", "log.console=false",
                          "algo.learning_starts=0", "train.vector_mode=sync"])
    c = build(cfg)
    try:
        c.collector.collect(c.learner)
        assert any(c.buffer.pending)
        (tmp_path / "run").mkdir()
        path = save(c, TrainState(env_steps=c.algo.steps_per_collect * 2), tmp_path / "run")
    finally:
        c.close()
    again = build(cfg)
    try:
        monkeypatch.setattr(again.collector, "restore_envs", lambda state: "the envs could not be restored")
        restore(again, path)
        assert again.buffer.pending == [[], []]
        assert again.notices == ["the envs could not be restored"]  # said when the run starts (console, train.log)
    finally:
        again.close()

