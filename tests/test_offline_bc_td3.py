"""BC, TD3+BC and ReBRAC: each loss against numbers worked out by hand, exact resume, and learning from small
datasets (Pendulum from tests/offline_fixtures.py; CartPole from a lean-following controller made here)."""

import io

import gymnasium as gym
import numpy as np
import pytest
import torch
from offline_fixtures import cartpole_dataset, dataset_replay, mean_return, pendulum_dataset
from torch import nn

from rlcli.actors.normalizer import RunningNorm
from rlcli.actors.offpolicy import NetworkRecipe
from rlcli.algos.bc import BC
from rlcli.algos.rebrac import ReBRAC, stored_next_actions
from rlcli.algos.td3_bc import TD3BC
from rlcli.batches import ReplayBatch
from rlcli.contracts import RunClock
from rlcli.registry import ConfigError

PENDULUM = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
CARTPOLE = gym.spaces.Discrete(2)
CLOCK = RunClock(0, 1)


def recipe(obs_dim=3, sizes=(16,)):
    return NetworkRecipe(obs_dim, list(sizes), "relu", False, RunningNorm((obs_dim,), enabled=False))


class Fixed(nn.Module):
    """A stand-in network that returns fixed outputs whatever it is given, so that a loss is plain arithmetic."""

    def __init__(self, out):
        super().__init__()
        self.out = out

    def forward(self, *inputs):
        return self.out


def train(algo, buffer, steps):
    for _ in range(steps):
        algo.update(buffer, CLOCK)


# ------------------------------------------------------------------------------------------ losses by hand


def test_bc_box_loss_is_the_mean_squared_error_to_the_data_actions():
    algo = BC(recipe(), gym.spaces.Box(-1.0, 1.0, (2,), np.float32), 1)
    algo.networks.policy = Fixed(torch.tensor([[0.5, 0.0], [-0.5, 1.0]]))
    loss, _ = algo.loss(torch.zeros(2, 3), torch.tensor([[0.0, 0.0], [0.5, 0.0]]))
    assert loss.item() == pytest.approx((0.25 + 0 + 1.0 + 1.0) / 4)


def test_bc_discrete_loss_is_the_cross_entropy_of_the_data_actions():
    algo = BC(recipe(), gym.spaces.Discrete(3), 1)
    algo.networks.policy = Fixed(torch.tensor([[0.0, 0.0, 0.0], [np.log(3.0), 0.0, 0.0]]))
    loss, _ = algo.loss(torch.zeros(2, 3), torch.tensor([1, 0]))
    # row 0: p = 1/3; row 1: p = 3/5
    assert loss.item() == pytest.approx((np.log(3.0) - np.log(0.6)) / 2, rel=1e-6)


def test_td3_bc_policy_loss_is_lambda_weighted_q_plus_mse_with_lambda_detached():
    algo = TD3BC(recipe(), PENDULUM, 1, alpha=2.5)
    q = torch.tensor([-2.0, -6.0], requires_grad=True)
    algo.networks.policy = Fixed(torch.tensor([[0.5], [-0.5]]))
    algo.networks.critics.nets[0] = Fixed(q)
    loss, mse = algo.policy_loss(torch.zeros(2, 3), torch.zeros(2, 1))
    # lambda = 2.5 / mean|Q| = 2.5 / 4; -lambda * mean Q = 2.5; mse = 0.25
    assert mse.item() == pytest.approx(0.25) and loss.item() == pytest.approx(2.75)
    loss.backward()
    torch.testing.assert_close(q.grad, torch.full((2,), -0.625 / 2))  # no gradient through lambda


@pytest.mark.parametrize(("normalize_q", "expected"), [(True, 2 * 0.75 + 1.0), (False, 2 * 0.75 + 4.5)])
def test_rebrac_policy_loss_penalizes_the_squared_distance_and_climbs_the_smallest_q(normalize_q, expected):
    algo = ReBRAC(recipe(), gym.spaces.Box(-1.0, 1.0, (2,), np.float32), 1, actor_bc_coef=2.0,
                  normalize_q=normalize_q)
    algo.networks.policy = Fixed(torch.tensor([[0.5, 0.0], [-0.5, 1.0]]))
    algo.networks.critics = Fixed(torch.tensor([[-2.0, -6.0], [-3.0, -5.0]]))  # min over critics: [-3, -6]
    loss, penalty = algo.policy_loss(torch.zeros(2, 3), torch.zeros(2, 2))
    # ||pi - a||^2 per row: 0.25, 1.25 (mean 0.75); lambda = 1 / 4.5 when normalized
    assert penalty.item() == pytest.approx(0.75) and loss.item() == pytest.approx(expected)


def test_rebrac_critic_target_subtracts_the_penalty_toward_the_data_next_action():
    algo = ReBRAC(recipe(), gym.spaces.Box(-1.0, 1.0, (2,), np.float32), 1, critic_bc_coef=2.0,
                  target_policy_noise=0.0)
    net = algo.networks
    net.policy_target = Fixed(torch.tensor([[0.5, 0.0], [-0.5, 1.0]]))
    net.critics_target = Fixed(torch.tensor([[1.0, 2.0], [0.5, 3.0]]))  # min: [0.5, 2]
    net.critics = Fixed(torch.tensor([[0.0, 0.0], [1.0, 1.0]]))
    batch = ReplayBatch(torch.zeros(2, 3), torch.zeros(2, 2), torch.ones(2), torch.zeros(2, 3),
                        torch.full((2,), 0.99), torch.ones(2), torch.arange(2))
    next_data = torch.tensor([[0.0, 0.0], [1.0, 1.0]])  # squared distances 0.25 and 2.25; the second has none
    loss, (errors, _) = algo.critic_loss(batch, None, next_data, torch.tensor([1.0, 0.0]))
    target = [1 + 0.99 * (0.5 - 2 * 0.25), 1 + 0.99 * 2.0]  # [1.0, 2.98]
    per_critic = [((0 - target[0]) ** 2 + (0 - target[1]) ** 2) / 2, ((1 - target[0]) ** 2 + (1 - target[1]) ** 2) / 2]
    assert loss.item() == pytest.approx(sum(per_critic))
    torch.testing.assert_close(errors, torch.tensor([(1.0 + 0.0) / 2, (2.98 + 1.98) / 2]))


def test_rebrac_reads_each_transitions_next_action_where_the_data_continues():
    data = pendulum_dataset(450)  # episodes of 200, 200 and 50 steps
    buffer = dataset_replay(data, PENDULUM)
    actions, follows = stored_next_actions(buffer, torch.arange(len(data)))
    ends = data.episode_ends
    np.testing.assert_array_equal(np.flatnonzero(follows.numpy() == 0), ends)
    inside = np.setdiff1d(np.arange(len(data)), ends)
    torch.testing.assert_close(actions[inside], buffer.actions[inside + 1])
    # a full ring: the newest slot's successor is the oldest, which does not follow it
    ring = dataset_replay(pendulum_dataset(200), PENDULUM)
    ring.add(torch.zeros(1, 3), torch.zeros(1, 1), np.zeros(1), np.ones((1, 3)), np.zeros(1, bool), np.zeros(1, bool),
             np.ones(1, bool))  # overwrites slot 0
    assert stored_next_actions(ring, torch.tensor([199, 0, 1]))[1].tolist() == [0.0, 0.0, 1.0]


def test_rebrac_puts_layer_norm_in_the_critics_only_by_default():
    algo = ReBRAC(recipe(sizes=(8, 8)), PENDULUM, 1)
    norms = lambda module: sum(isinstance(m, nn.LayerNorm) for m in module.modules())  # noqa: E731
    net = algo.networks
    assert (norms(net.critics), norms(net.critics_target), norms(net.policy)) == (4, 4, 0)
    trained = {id(p) for p in algo.critic_optimizer.param_groups[0]["params"]}
    assert trained == {id(p) for p in net.critics.parameters()}  # the LayerNorms' weights are trained too
    assert norms(ReBRAC(recipe(sizes=(8, 8)), PENDULUM, 1, actor_layer_norm=True).networks.policy) == 2


@pytest.mark.parametrize(("make", "message"), [
    (lambda: BC(recipe(), PENDULUM, 1, lr=0.0), "algo.lr=0.0 is invalid"),
    (lambda: BC(recipe(), PENDULUM, 1, max_grad_norm=-1.0), "algo.max_grad_norm=-1.0 is invalid"),
    (lambda: TD3BC(recipe(), PENDULUM, 1, alpha=-1.0), "algo.alpha=-1.0 is invalid"),
    (lambda: TD3BC(recipe(), PENDULUM, 1, policy_delay=0), "algo.policy_delay=0 is invalid"),
    (lambda: ReBRAC(recipe(), PENDULUM, 1, critic_bc_coef=-0.5), "algo.critic_bc_coef=-0.5 is invalid"),
    (lambda: ReBRAC(recipe(), PENDULUM, 1, batch_size=0), "algo.batch_size=0 is invalid"),
])
def test_bad_settings_are_one_line(make, message):
    with pytest.raises(ConfigError) as error:
        make()
    assert message in str(error.value) and "\n" not in str(error.value)


# --------------------------------------------------------------------------------------------- resume


MAKERS = {
    "bc_box": lambda: BC(recipe(), PENDULUM, 1, batch_size=32),
    "bc_discrete": lambda: BC(recipe(4), CARTPOLE, 1, batch_size=32),
    "td3_bc": lambda: TD3BC(recipe(), PENDULUM, 1, batch_size=32),
    "rebrac": lambda: ReBRAC(recipe(), PENDULUM, 1, batch_size=32, actor_layer_norm=True),
}


@pytest.mark.parametrize("name", list(MAKERS))
def test_a_loaded_state_continues_bit_identically(name, one_thread):
    data = cartpole_dataset(300) if name == "bc_discrete" else pendulum_dataset(300)
    buffer = dataset_replay(data, CARTPOLE if name == "bc_discrete" else PENDULUM)
    torch.manual_seed(0)
    whole = MAKERS[name]()
    train(whole, buffer, 5)  # an odd count: the resumed half begins between two policy updates (policy_delay 2)
    saved = io.BytesIO()
    torch.save(whole.state_dict(), saved)
    rng = torch.get_rng_state()
    train(whole, buffer, 5)

    torch.manual_seed(1)  # a fresh algorithm's own initialization, overwritten by the load
    resumed = MAKERS[name]()
    saved.seek(0)
    resumed.load_state_dict(torch.load(saved))
    torch.set_rng_state(rng)
    train(resumed, buffer, 5)
    for (key, a), b in zip(whole.state_dict()["networks"].items(), resumed.state_dict()["networks"].values(),
                           strict=True):
        assert torch.equal(a, b), key
    for opt_a, opt_b in zip(whole.optimizers(), resumed.optimizers(), strict=True):
        for state_a, state_b in zip(opt_a.state.values(), opt_b.state.values(), strict=True):
            assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)


# -------------------------------------------------------------------------------------------- learning


def pendulum_policy(algo):
    def act(obs):
        actions = algo.act(torch.as_tensor(obs, dtype=torch.float32)[None], deterministic=True).actions
        return algo.env_actions(actions)[0].numpy()

    return act


@pytest.fixture
def one_thread():
    """Small networks step fastest on one thread (the trainer's torch_threads=1); two fight over shared cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def pendulum_replay():
    return dataset_replay(pendulum_dataset(5000, noise=0.3), PENDULUM)


LEARNERS = {  # small networks, the papers' losses; steps and learning rates sized for a test
    "bc": (lambda: BC(recipe(sizes=(64, 64)), PENDULUM, 1, lr=1e-3), 2000),
    "td3_bc": (lambda: TD3BC(recipe(sizes=(64, 64)), PENDULUM, 1, lr=1e-3), 2000),
    "rebrac": (lambda: ReBRAC(recipe(sizes=(64, 64)), PENDULUM, 1, batch_size=256), 1500),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LEARNERS))
def test_learns_pendulum_from_noisy_controller_data(name, pendulum_replay, one_thread):
    make, steps = LEARNERS[name]
    torch.manual_seed(0)
    algo = make()
    train(algo, pendulum_replay, steps)
    assert mean_return(pendulum_policy(algo), episodes=3) > -700  # random: about -1,200; the data: about -200


@pytest.mark.slow
def test_discrete_bc_learns_cartpole_from_controller_data(one_thread):
    buffer = dataset_replay(cartpole_dataset(5000, random_fraction=0.1), CARTPOLE)
    torch.manual_seed(0)
    algo = BC(recipe(4, (64, 64)), CARTPOLE, 1, lr=1e-3)
    train(algo, buffer, 1500)
    env, total = gym.make("CartPole-v1"), 0.0
    for episode in range(3):
        obs, _ = env.reset(seed=100 + episode)
        done = False
        while not done:
            action = algo.act(torch.as_tensor(obs)[None], deterministic=True).actions
            obs, reward, terminated, truncated, _ = env.step(int(action[0]))
            total, done = total + float(reward), terminated or truncated
    assert total / 3 > 150
