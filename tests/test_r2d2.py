"""Recurrent DQN (R2D2): sequence storage with overlap, episode starts, burn-in, bad input."""

import numpy as np
import pytest
import torch
from conftest import at
from test_configs import composed

from rlcli.buffers.sequence import SequenceReplayBuffer
from rlcli.contracts import RecurrentState
from rlcli.envs.memory_cue import MemoryCueEnv
from rlcli.registry import ConfigError
from rlcli.run.build import build

QUIET = ["log.console=false", "log.tensorboard=false"]


def feed(buffer, steps, envs=1, valid_at=lambda t: True):
    """Step t of env i has observation 100 * i + t, action t % 2, reward t, and carry t."""
    for t in range(steps):
        obs = torch.tensor([[100.0 * i + t] for i in range(envs)])
        next_obs = np.array([[100.0 * i + t + 1] for i in range(envs)])
        valid = np.array([valid_at(t)] * envs)
        starts = torch.tensor([float(t > 0 and not valid_at(t - 1))] * envs)
        carry = torch.full((envs, 3), float(t))
        buffer.add(obs, torch.full((envs,), t % 2), np.full(envs, float(t)), next_obs, np.zeros(envs),
                   np.zeros(envs, bool), valid, starts, carry)


def test_sequences_overlap_and_keep_their_first_carry():
    buffer = SequenceReplayBuffer(capacity=600, seq_len=4, burn_in=2, sequence_overlap=0.5, num_envs=2,
                                  obs_shape=(1,), carry_size=3, device=torch.device("cpu"))
    assert buffer.length == 6 and buffer.stride == 3 and buffer.capacity == 100
    feed(buffer, 12, envs=2)
    # per env, sequences start at steps 0, 3, 6 (the one starting at 9 is not complete yet)
    assert len(buffer) == 6
    firsts = sorted(buffer.obs[: len(buffer), 0, 0].tolist())
    assert firsts == [0, 3, 6, 100, 103, 106]
    k = buffer.obs[:, 0, 0].tolist().index(103.0)
    assert buffer.obs[k, :, 0].tolist() == [103, 104, 105, 106, 107, 108, 109]  # L + 1 observations
    assert buffer.rewards[k].tolist() == [3, 4, 5, 6, 7, 8]
    assert buffer.actions[k].tolist() == [1, 0, 1, 0, 1, 0]
    assert buffer.carry0[k].tolist() == [3, 3, 3]  # the carry the actor had at the sequence's first step


def test_reset_steps_are_kept_but_invalid_and_the_next_step_starts_an_episode():
    buffer = SequenceReplayBuffer(capacity=100, seq_len=5, burn_in=0, sequence_overlap=0.0, num_envs=1,
                                  obs_shape=(1,), carry_size=3, device=torch.device("cpu"))
    feed(buffer, 5, valid_at=lambda t: t != 2)  # step 2 is a reset step: step 3 begins an episode
    assert buffer.valid[0].tolist() == [1, 1, 0, 1, 1]
    assert buffer.starts[0].tolist() == [0, 0, 0, 1, 0, 0]
    feed(buffer, 5, valid_at=lambda t: t != 4)  # the last step is a reset step: the extra obs starts one
    assert buffer.starts[1].tolist() == [0, 0, 0, 0, 0, 1]


def test_sampled_batches_are_time_major():
    buffer = SequenceReplayBuffer(capacity=100, seq_len=3, burn_in=1, sequence_overlap=0.0, num_envs=1,
                                  obs_shape=(1,), carry_size=3, device=torch.device("cpu"))
    feed(buffer, 40)
    batch = buffer.sample(5)
    assert batch.obs.shape == (5, 5, 1) and batch.actions.shape == (4, 5) and batch.starts.shape == (5, 5)
    assert batch.carry0.shape == (5, 3)
    assert torch.equal(batch.obs[1:, :, 0] - batch.obs[:-1, :, 0], torch.ones(4, 5))  # consecutive steps


def test_bad_sequence_settings():
    for kwargs, message in [({"seq_len": 0}, "buffer.seq_len=0"), ({"burn_in": -1}, "buffer.burn_in=-1"),
                            ({"sequence_overlap": 1.0}, "buffer.sequence_overlap=1.0"),
                            ({"capacity": 5}, "buffer.capacity=5")]:
        settings = {"capacity": 100, "seq_len": 4, "burn_in": 2, "sequence_overlap": 0.5} | kwargs
        with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
            SequenceReplayBuffer(**settings, num_envs=1, obs_shape=(1,), carry_size=3, device=torch.device("cpu"))


def r2d2_parts(*extra):
    cfg = composed("algo=dqn", "actor=gru", "buffer=sequence", "env=MemoryCue-v0", "buffer.seq_len=6",
                   "buffer.burn_in=3", "algo.learning_starts=64", "algo.batch_size=8", *extra, *QUIET)
    return build(cfg)


def test_burn_in_refreshes_the_stored_state_without_gradients():
    parts = r2d2_parts()
    algo, buffer = parts.algo, parts.buffer
    for _ in range(40):
        parts.collector.collect(parts.learner, random_actions=True)
    batch = buffer.sample(8)
    assert batch.burn_in == 3  # the batch says how many of its steps warm the carry up
    net = algo.networks
    # the loss's Q-values after burn-in equal a plain unroll over the whole sequence from the stored carry
    with torch.no_grad():
        full, _ = net.q.unroll(batch.obs, batch.starts, batch.carry0)
    obs = batch.obs.clone().requires_grad_(True)
    loss, (_, q_mean) = algo._sequence_loss(batch._replace(obs=obs, burn_in=3))
    taken = full[3:-1].gather(-1, batch.actions[3:].unsqueeze(-1)).squeeze(-1)
    valid = batch.valid[3:]
    assert float(q_mean) == pytest.approx(float((taken * valid).sum() / valid.sum()), rel=1e-5)
    # no gradient flows through the burn-in steps (nor the target), only through the learned ones
    loss.backward()
    assert torch.all(obs.grad[:3] == 0) and obs.grad[3:-1].abs().sum() > 0
    assert all(p.grad is not None for p in net.q.parameters())
    parts.close()


def test_acting_steps_the_same_network_that_learning_unrolls():
    parts = r2d2_parts()
    net = parts.algo.networks
    env = MemoryCueEnv(delay=8)
    obs, _ = env.reset(seed=0)
    observations = [obs]
    for _ in range(5):
        obs, *_ = env.step(0)
        observations.append(obs)
    x = torch.as_tensor(np.stack(observations)).unsqueeze(1)  # [T, 1, 2]
    starts = torch.zeros(6, 1)
    starts[0] = 1
    unrolled, _ = net.q.unroll(x, starts, net.initial_carry(1))
    carry, stepped = net.initial_carry(1), []
    for t in range(6):
        q, carry = net.q_values(x[t], RecurrentState(carry, starts[t]))
        stepped.append(q)
    assert torch.allclose(torch.stack(stepped), unrolled, atol=1e-6)
    parts.close()


@pytest.mark.parametrize(("overrides", "message"), [
    (["algo=dqn", "actor=gru", "env=MemoryCue-v0"], "algo=dqn with actor=gru learns from stored sequences: use "
                                                    "buffer=sequence"),
    (["algo=dqn", "buffer=sequence", "env=MemoryCue-v0"], "buffer=sequence stores sequences for recurrent actors"),
    (["algo=td3", "actor=gru", "env=Pendulum-v1"], "algo=td3 does not support actor=gru yet; choose from: mlp, cnn"),
    (["algo=sac", "actor=gru", "env=Pendulum-v1"], "algo=sac with actor=gru learns from stored sequences: use "
                                                   "buffer=sequence"),
    (["algo=dqn", "actor=lstm", "buffer=sequence", "algo.dueling=true"], "algo.dueling=true is invalid"),
])
def test_bad_recurrent_off_policy_settings(overrides, message):
    with pytest.raises(ConfigError) as error:
        build(composed(*overrides, *QUIET))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_recurrent_sac_stores_float_actions_and_learns_only_after_burn_in():
    cfg = composed("algo=sac", "actor=gru", "buffer=sequence", "env=Pendulum-v1", "train.num_envs=2",
                   "buffer.seq_len=6", "buffer.burn_in=2", "algo.learning_starts=64", "algo.batch_size=8",
                   "actor.rnn_size=16", *QUIET)
    parts = build(cfg)
    algo, buffer = parts.algo, parts.buffer
    for _ in range(40):
        parts.collector.collect(parts.learner, random_actions=True)
    assert buffer.actions.dtype == torch.float32 and buffer.actions.shape[1:] == (8, 1)
    assert len(buffer) > 0 and buffer.actions[: len(buffer)].abs().max() <= 1.0  # stored in [-1, 1]
    policy = [p.clone() for p in algo.networks.policy.parameters()]
    critics = [p.clone() for p in algo.networks.critics.parameters()]
    metrics = algo.update(buffer, at(0.0))
    assert {"value_loss", "policy_loss", "alpha", "entropy"} <= set(metrics)
    assert all(torch.isfinite(v) for v in metrics.values())
    changed = lambda before, now: any(not torch.equal(a, b) for a, b in zip(before, now, strict=True))  # noqa: E731
    assert changed(policy, algo.networks.policy.parameters()) and changed(critics, algo.networks.critics.parameters())
    # burn-in: no gradient reaches the first burn_in observations through the critics' loss
    batch = buffer.sample(8)
    obs = batch.obs.clone().requires_grad_(True)
    features = algo.networks.critics.features(obs, batch.starts, 2)
    algo.networks.critics.q([h[:-1] for h in features], batch.actions[2:]).sum().backward()
    assert torch.all(obs.grad[:2] == 0) and obs.grad[2:-1].abs().sum() > 0
    parts.close()


def test_recurrent_sac_losses_against_a_plain_reference_and_blind_to_padding():
    """The sequence losses (SAC's recurrent actor through its one _gradient_step): the critics' soft TD loss and the
    policy's loss equal a per-critic, position-by-position reference; positions marked invalid (padding) change
    neither; the temperature reads the log-probs of the real transitions only."""
    from rlcli.actors.offpolicy import squashed_gaussian
    from rlcli.algos.offpolicy import soft_next_value

    cfg = composed("algo=sac", "actor=gru", "buffer=sequence", "env=Pendulum-v1", "train.num_envs=2",
                   "buffer.seq_len=6", "buffer.burn_in=2", "algo.learning_starts=64", "algo.batch_size=8",
                   "actor.rnn_size=16", *QUIET)
    parts = build(cfg)
    algo, buffer = parts.algo, parts.buffer
    for _ in range(40):
        parts.collector.collect(parts.learner, random_actions=True)
    torch.manual_seed(0)
    batch, burn, alpha = buffer.sample(8), 2, torch.tensor(0.3)
    valid = batch.valid.clone()
    valid[-2:, :3] = 0.0  # the last two steps of three sequences are padding
    batch = batch._replace(valid=valid)
    noise = torch.randn(batch.obs.shape[0] - burn, 8, 1)
    net = algo.networks
    with torch.no_grad():
        _, carry = net.policy.unroll(batch.obs[:burn], batch.starts[:burn], batch.carry0)
        params, _ = net.policy.unroll(batch.obs[burn:], batch.starts[burn:], carry)
        actions, log_probs = squashed_gaussian(params, noise=noise)
        target_h = [h[burn + 1:] for h in net.critics_target.features(batch.obs, batch.starts, 0)]
        next_q = soft_next_value(net.critics_target.q(target_h, actions[1:]), log_probs[1:], alpha)
        target = batch.rewards[burn:] + algo.gamma * (1 - batch.terminated[burn:]) * next_q
        qs = net.critics.q([h[:-1] for h in net.critics.features(batch.obs, batch.starts, burn)], batch.actions[burn:])
        q_pi = net.critics.q([h[:-1] for h in net.critics.features(batch.obs, batch.starts, burn)],
                             actions[:-1]).min(0).values
    real = [(t, b) for t in range(valid.shape[0] - burn) for b in range(8) if valid[burn + t, b] > 0]
    critic_ref = sum(0.5 * sum(float((qs[i, t, b] - target[t, b]) ** 2) for t, b in real) / len(real)
                     for i in range(qs.shape[0]))
    policy_ref = sum(float(alpha * log_probs[t, b] - q_pi[t, b]) for t, b in real) / len(real)
    critic_loss, errors = algo.sequence_td_loss(batch, alpha, noise)
    policy_loss, (temperature_log_probs, temperature_mask) = algo.sequence_actor_loss(batch, alpha, noise)
    assert errors == ()
    assert abs(float(critic_loss) - critic_ref) < 1e-5 * max(1.0, abs(critic_ref))
    assert abs(float(policy_loss) - policy_ref) < 1e-5 * max(1.0, abs(policy_ref))
    assert torch.equal(temperature_mask, valid[burn:]) and temperature_log_probs.shape == valid[burn:].shape
    # what sits in the padding does not matter: its rewards, and the observations after the last real step
    padded = batch.rewards.clone()
    padded[valid == 0] = 1e6
    assert torch.equal(algo.sequence_td_loss(batch._replace(rewards=padded), alpha, noise)[0], critic_loss)
    late = batch.obs.clone()
    late[-2:, :3] += 100.0  # the padded steps' observations and the final one of those three sequences
    assert torch.allclose(algo.sequence_td_loss(batch._replace(obs=late), alpha, noise)[0], critic_loss, atol=1e-6)
    assert torch.allclose(algo.sequence_actor_loss(batch._replace(obs=late), alpha, noise)[0], policy_loss, atol=1e-6)
    # a batch with no real step after the burn-in: zero losses, no NaN (the temperature's mean included)
    empty = batch._replace(valid=torch.zeros_like(valid))
    from rlcli.algos.runner import SingleRun

    metrics = algo._gradient_step(empty, SingleRun(algo, buffer))[1]
    assert all(torch.isfinite(v) for v in metrics.values()), metrics
    parts.close()
