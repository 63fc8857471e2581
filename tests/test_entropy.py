"""The shared entropy coefficient (algos/entropy.py) against a plain reference."""

import math

import pytest
import torch
from torch import nn

from rlcli.algos.entropy import EntropyCoefficient, check_entropy_settings, initial_log_alpha
from rlcli.registry import ConfigError


def test_learned_alpha_takes_adams_step_on_the_temperature_loss():
    networks = nn.Module()
    networks.log_alpha = log_alpha = nn.Parameter(torch.tensor(initial_log_alpha("auto", 0.5)))
    coef = EntropyCoefficient(log_alpha, "auto", "auto", action_dim=3, lr=0.1)
    step = coef.train_step(networks, None)  # what SAC, TQC, CrossQ and MASAC step (algos/entropy.py)
    assert coef.learned and coef.target_entropy == -3.0 and torch.isclose(coef.value(), torch.tensor(0.5))
    log_probs = torch.tensor([-1.0, -2.0, 0.5, 1.5])
    # plain reference: loss = -mean(log_alpha * (log_probs + target)); d loss / d log_alpha = -mean(log_probs + target)
    reference = nn.Parameter(torch.tensor(math.log(0.5)))
    optimizer = torch.optim.Adam([reference], lr=0.1)
    for _ in range(3):
        step(log_probs, coef.target())
        optimizer.zero_grad()
        (-(reference * (log_probs - 3.0)).mean()).backward()  # target entropy -3
        optimizer.step()
    assert torch.allclose(log_alpha.detach(), reference.detach(), atol=1e-6)
    assert log_alpha.item() < math.log(0.5)  # entropy (-mean log_prob = -0.25) is above the target -3: alpha falls


def test_fixed_alpha_is_its_value_and_not_learned():
    log_alpha = nn.Parameter(torch.tensor(initial_log_alpha(0.2, 1.0)))
    coef = EntropyCoefficient(log_alpha, 0.2, -1.0, action_dim=1, lr=0.1)
    assert not coef.learned and coef.value().item() == pytest.approx(0.2) and log_alpha.item() == pytest.approx(
        math.log(0.2))
    assert initial_log_alpha(0.0, 1.0) == pytest.approx(math.log(1e-30))  # alpha 0: floored above 0


@pytest.mark.parametrize(("args", "key"), [(("sometimes", 1.0, "auto"), "algo.ent_coef"),
                                           ((-0.1, 1.0, "auto"), "algo.ent_coef"),
                                           (("auto", 0.0, "auto"), "algo.ent_coef_init"),
                                           (("auto", 1.0, "high"), "algo.target_entropy")])
def test_bad_entropy_settings_are_one_line(args, key):
    with pytest.raises(ConfigError, match=key):
        check_entropy_settings(*args)
