"""Policy-loss add-ons: the KL attraction toward a prior policy loaded from a checkpoint."""

import pytest
import torch
from conftest import at
from test_configs import composed
from torch.distributions import Categorical, Independent, Normal, kl_divergence

from rlcli.actors.heads import CategoricalHead, GaussianHead
from rlcli.algos.addons import addon_losses
from rlcli.registry import ConfigError
from rlcli.run.build import build
from rlcli.run.state import prepare
from rlcli.run.trainer import Trainer


def test_categorical_kl_matches_torch_distributions():
    p, q = torch.log_softmax(torch.randn(5, 3), -1), torch.log_softmax(torch.randn(5, 3), -1)
    expected = kl_divergence(Categorical(logits=p), Categorical(logits=q))
    assert torch.allclose(CategoricalHead.kl(p, q), expected, atol=1e-6)


def test_gaussian_kl_matches_torch_distributions():
    p_head, q_head = GaussianHead(4, 2, log_std_init=-0.3), GaussianHead(4, 2, log_std_init=0.4)
    p_mean, q_mean = torch.randn(5, 2), torch.randn(5, 2)
    expected = kl_divergence(Independent(Normal(p_mean, p_head.log_std.exp()), 1),
                             Independent(Normal(q_mean, q_head.log_std.exp()), 1))
    assert torch.allclose(q_head.kl(p_mean, q_mean, p_head), expected, atol=1e-5)


@pytest.fixture(scope="module")
def prior_checkpoint(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("prior")
    cfg = composed("algo=ppo", "env=CartPole-v1", "train.total_steps=512", "train.test_every=0", "seed=3",
                   "log.console=false", "log.tensorboard=false")
    components, state = prepare(cfg)
    Trainer(components, run_dir, state).run()
    return run_dir / "checkpoints" / "latest"


def _with_prior(path, *extra):
    cfg = composed("algo=ppo", "env=CartPole-v1", "log.console=false", "log.tensorboard=false",
                   f"++algo.policy_loss_addons.kl_prior.checkpoint={path}",
                   "++algo.policy_loss_addons.kl_prior.coef=0.5", *extra)
    return build(cfg)


def test_kl_prior_is_zero_against_itself_and_positive_against_another_policy(prior_checkpoint):
    same = _with_prior(prior_checkpoint, f"actor.init_from={prior_checkpoint}")
    other = _with_prior(prior_checkpoint, "seed=9")
    obs = torch.randn(64, 4)
    mask = torch.ones(64)
    term, logs = addon_losses(same.algo.policy_addons, same.algo.networks, obs, mask)
    assert float(logs["kl_prior"]) == pytest.approx(0.0, abs=1e-7)
    term, logs = addon_losses(other.algo.policy_addons, other.algo.networks, obs, mask)
    assert float(logs["kl_prior"]) > 0 and float(term.detach()) == pytest.approx(0.5 * float(logs["kl_prior"]))
    term.backward()  # the gradient reaches the current policy only
    assert other.algo.networks.pi_body[0].weight.grad is not None
    assert all(p.grad is None for p in other.algo.policy_addons[0].prior.parameters())
    same.close()
    other.close()


def test_kl_prior_coefficient_is_schedulable_and_logged(prior_checkpoint):
    parts = _with_prior(prior_checkpoint, "++algo.schedules.kl_prior_coef=linear:0.5:0.0", "algo.n_steps=32",
                          "algo.n_epochs=1")
    parts.collector.collect(parts.learner)
    from rlcli.schedules import apply_schedules

    apply_schedules(parts.schedules, 0.5)
    assert parts.addons[0].coef == pytest.approx(0.25)
    metrics = parts.algo.update(parts.buffer, at(0.5))
    assert "kl_prior" in metrics
    parts.close()


def test_bad_addons_are_one_line_errors(prior_checkpoint):
    with pytest.raises(ConfigError, match="unknown add-on.*choose from: kl_prior"):
        build(composed("algo=ppo", "++algo.policy_loss_addons.kl_pior.coef=1"))
    with pytest.raises(ConfigError, match="checkpoint is not set"):
        build(composed("algo=ppo", "++algo.policy_loss_addons.kl_prior.coef=1"))
    with pytest.raises(ConfigError, match="does not fit this actor"):
        _with_prior(prior_checkpoint, "actor.hidden_sizes=[8]")


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ppo", "a2c"])
def test_compiled_updates_with_a_scheduled_kl_prior_match_eager_without_recompiling(prior_checkpoint, algo,
                                                                                    tmp_path):
    """The add-ons' coefficients enter a compiled step as a tensor: a scheduled kl_prior_coef changes every update
    without a new graph, and the weights stay within float reordering of the eager run's (measured: PPO 9e-8,
    A2C 6e-8 after 1k steps, the coefficient scheduled from 0.5 to 0)."""
    from test_compile import eager_and_compiled
    from torch._dynamo.utils import counters

    from rlcli.algos.loss_step import compile_enabled

    args = [f"algo={algo}", "env=CartPole-v1", "algo.n_steps=32", "train.total_steps=1024", "train.test_every=0",
            "log.console=false", "log.tensorboard=false", "deterministic=true",
            f"++algo.policy_loss_addons.kl_prior.checkpoint={prior_checkpoint}",
            "++algo.policy_loss_addons.kl_prior.coef=0.5", "++algo.schedules.kl_prior_coef=linear:0.5:0.0"]
    graphs = counters["stats"]["unique_graphs"]
    eager, compiled = eager_and_compiled(tmp_path, args)
    assert counters["stats"]["unique_graphs"] - graphs == 1  # one graph for the whole run, the schedule moving
    assert compile_enabled(compiled) and compiled.policy_addons[0].coef < 0.5
    for (name, a), b in zip(eager.networks.state_dict().items(), compiled.networks.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4, msg=name)
