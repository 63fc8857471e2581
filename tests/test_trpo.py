"""TRPO: the conjugate-gradient solve, the Fisher-vector product and the KL line search, against plain
references (a direct linear solve, the explicit Hessian of the KL), and a short learning run."""

import json

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import run_cli
from torch.func import functional_call

from rlcli.actors.heads import GaussianHead
from rlcli.actors.mlp import ActorCritic
from rlcli.actors.sde import SdeOptions
from rlcli.algos.trpo import TRPO, conjugate_gradient, fisher_vector_product
from rlcli.batches import RolloutBatch
from rlcli.registry import ConfigError


def test_conjugate_gradient_solves_a_positive_definite_system():
    torch.manual_seed(0)
    m = torch.randn(6, 6, dtype=torch.float64)
    a = m @ m.T + 0.5 * torch.eye(6, dtype=torch.float64)
    b = torch.randn(6, dtype=torch.float64)
    x = conjugate_gradient(lambda v: a @ v, b, max_iter=6)  # n steps solve an n x n system exactly
    torch.testing.assert_close(x, torch.linalg.solve(a, b), rtol=1e-8, atol=1e-10)
    few = conjugate_gradient(lambda v: a @ v, b, max_iter=2)  # fewer steps: closer than the start, not exact
    exact = torch.linalg.solve(a, b)
    assert 0 < (few - exact).norm() < exact.norm()


def networks(action_space: gym.spaces.Space, sde: SdeOptions | None = None) -> ActorCritic:
    torch.manual_seed(1)
    obs_space = gym.spaces.Box(-1, 1, (3,))
    return ActorCritic(obs_space, action_space, [8], "tanh", shared=False, ortho_init=True, log_std_init=-0.5,
                       normalize_obs=False, clip_obs=10.0, sde=sde).double()


def old_log_std(net: ActorCritic) -> torch.Tensor | None:
    """What TRPO keeps of the policy before its step besides the head's output: a plain Gaussian's log std."""
    return net.head.log_std.detach().clone() if isinstance(net.head, GaussianHead) else None


SPACES = [gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (2,))]


@pytest.mark.parametrize("action_space", SPACES, ids=["discrete", "box"])
def test_fisher_vector_product_is_the_kl_hessian_times_the_vector(action_space):
    net = networks(action_space)
    algo = TRPO(net, num_envs=1, n_steps=16, batch_size=16)
    params = algo.policy_parameters
    names = {id(p): name for name, p in net.named_parameters()}
    obs = torch.randn(16, 3, dtype=torch.float64)
    with torch.no_grad():
        old = (net.policy_params(obs), None if net.discrete else net.head.log_std.clone())
    mask = torch.ones(16, dtype=torch.float64)
    mask[5] = 0.0  # a reset step: out of the mean KL

    def mean_kl_at(flat: torch.Tensor) -> torch.Tensor:  # the plain reference: KL as a function of the weights
        tensors, start = {}, 0
        for p in params:
            tensors[names[id(p)]] = flat[start:start + p.numel()].view_as(p)
            start += p.numel()
        head = {k.removeprefix("head."): v for k, v in tensors.items() if k.startswith("head.")}
        body = {k.removeprefix("pi_body."): v for k, v in tensors.items() if k.startswith("pi_body.")}
        mean = functional_call(net.head, head, (functional_call(net.pi_body, body, (obs,)),))
        if net.discrete:
            kl = (old[0].exp() * (old[0] - mean)).sum(-1)
        else:
            log_std = tensors["head.log_std"]
            kl = 0.5 * (torch.exp(2 * (old[1] - log_std)) + ((old[0] - mean) / log_std.exp()).square()
                        - 1 - 2 * (old[1] - log_std)).sum(-1)
        return (kl * mask).sum() / mask.sum()

    flat = torch.cat([p.detach().reshape(-1) for p in params])
    hessian = torch.autograd.functional.hessian(mean_kl_at, flat)
    new = net.policy_params(obs)
    kl = (algo._kl(old, new) * mask).sum() / mask.sum()
    product = fisher_vector_product(kl, params, damping=0.1)
    v = torch.randn_like(flat)
    torch.testing.assert_close(product(v), hessian @ v + 0.1 * v, rtol=1e-8, atol=1e-10)


def rollout(net: ActorCritic, advantages: torch.Tensor) -> RolloutBatch:
    torch.manual_seed(2)
    obs = torch.randn(64, 3, dtype=torch.float64)
    with torch.no_grad():
        out = net.act(obs)
    zeros = torch.zeros(64, dtype=torch.float64)
    return RolloutBatch(obs, out.actions, out.log_probs, out.values, advantages, zeros, torch.ones(64,
                        dtype=torch.float64))


@pytest.mark.parametrize(("action_space", "sde"), [
    *((space, None) for space in SPACES), (gym.spaces.MultiDiscrete([3, 2]), None), (gym.spaces.MultiBinary(3), None),
    (gym.spaces.Box(-1, 1, (2,)), SdeOptions())], ids=["discrete", "box", "multidiscrete", "multibinary", "box-gsde"])
def test_the_accepted_step_improves_the_surrogate_inside_the_kl_radius(action_space, sde):
    net = networks(action_space, sde)
    algo = TRPO(net, num_envs=1, n_steps=64, batch_size=64, target_kl=0.01, use_sde=sde is not None)
    if sde is not None:
        net.head.noise.reset_noise(64)
    batch = rollout(net, torch.randn(64, dtype=torch.float64))
    before = net.policy_params(batch.obs).detach()
    old = (before, old_log_std(net))
    stats = algo.policy_step(batch)
    assert stats["line_search_success"] == 1.0
    with torch.no_grad():
        kl = algo._kl(old, net.policy_params(batch.obs)).mean().item()
    assert 0 < kl < 0.01
    assert abs(stats["kl"].item() - kl) < 1e-12
    assert stats["policy_objective"] > 0  # the surrogate was 0 (normalized advantages, ratio 1) before the step


def test_no_step_when_nothing_can_improve():
    net = networks(gym.spaces.Discrete(3))
    algo = TRPO(net, num_envs=1, n_steps=64, batch_size=64, normalize_advantage=False)
    batch = rollout(net, torch.zeros(64, dtype=torch.float64))  # zero advantages: a zero gradient
    weights = {k: v.clone() for k, v in net.state_dict().items()}
    stats = algo.policy_step(batch)
    assert stats["line_search_success"] == 0.0
    for k, v in net.state_dict().items():
        assert torch.equal(v, weights[k]), k


def test_trpo_refuses_bad_settings_in_one_line():
    net = networks(gym.spaces.Discrete(3))
    with pytest.raises(ConfigError, match="algo.target_kl=0"):
        TRPO(net, num_envs=1, n_steps=8, batch_size=8, target_kl=0)
    with pytest.raises(ConfigError, match="algo.line_search_shrinking_factor=1.5"):
        TRPO(net, num_envs=1, n_steps=8, batch_size=8, line_search_shrinking_factor=1.5)


def test_trpo_refuses_a_recurrent_actor(tmp_path):
    out = run_cli("algo=trpo", "actor=lstm", "env=CartPole-v1", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert out.returncode != 0
    assert "algo=trpo does not support actor=lstm" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_trpo_solves_cartpole(tmp_path):
    """RL-Zoo's tuned TRPO CartPole config; stops at the env's threshold (475)."""
    out = run_cli("algo=trpo", "env=CartPole-v1", "train.total_steps=60000", "log.console=false",
                  f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    phases = [json.loads(line) for line in (tmp_path / "run" / "eval.jsonl").read_text().splitlines()]
    assert np.mean(phases[-1]["returns"]) >= 475, phases[-1]
