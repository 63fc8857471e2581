"""The shared entropy coefficient (algos/entropy.py) against a plain reference."""

import math

import pytest
import torch
from torch import nn

from rlcli.algos.entropy import EntropyCoefficient, check_entropy_settings, initial_log_alpha
from rlcli.registry import ConfigError


def test_learned_alpha_takes_adams_step_on_the_temperature_loss():
    log_alpha = nn.Parameter(torch.tensor(initial_log_alpha("auto", 0.5)))
    coef = EntropyCoefficient(log_alpha, "auto", "auto", action_dim=3, lr=0.1)
    assert coef.learned and coef.target_entropy == -3.0 and torch.isclose(coef.value(), torch.tensor(0.5))
    log_probs = torch.tensor([-1.0, -2.0, 0.5, 1.5])
    # plain reference: loss = -mean(log_alpha * (log_probs + target)); d loss / d log_alpha = -mean(log_probs + target)
    reference = nn.Parameter(torch.tensor(math.log(0.5)))
    optimizer = torch.optim.Adam([reference], lr=0.1)
    for _ in range(3):
        coef.step(log_probs, max_grad_norm=None)
        optimizer.zero_grad()
        (-(reference * (log_probs - 3.0)).mean()).backward()  # target entropy -3
        optimizer.step()
    assert torch.allclose(log_alpha.detach(), reference.detach(), atol=1e-6)
    assert log_alpha.item() < math.log(0.5)  # entropy (-mean log_prob = -0.25) is above the target -3: alpha falls


def test_fixed_alpha_never_moves_and_masks_average_over_real_steps():
    log_alpha = nn.Parameter(torch.tensor(initial_log_alpha(0.2, 1.0)))
    coef = EntropyCoefficient(log_alpha, 0.2, -1.0, action_dim=1, lr=0.1)
    coef.step(torch.randn(8), max_grad_norm=1.0)
    assert not coef.learned and coef.value().item() == pytest.approx(0.2) and log_alpha.item() == pytest.approx(
        math.log(0.2))
    learned = EntropyCoefficient(nn.Parameter(torch.tensor(0.0)), "auto", -1.0, action_dim=1, lr=0.1)
    mask = torch.tensor([1.0, 1.0, 0.0])
    seen = []
    learned.step(torch.tensor([0.0, 2.0, 100.0]), None, mean=lambda x: seen.append(x) or (x * mask).sum() / mask.sum())
    assert len(seen) == 1  # the caller's (masked) mean is the one used
    assert initial_log_alpha(0.0, 1.0) == pytest.approx(math.log(1e-30))  # alpha 0: floored above 0


@pytest.mark.parametrize(("args", "key"), [(("sometimes", 1.0, "auto"), "algo.ent_coef"),
                                           ((-0.1, 1.0, "auto"), "algo.ent_coef"),
                                           (("auto", 0.0, "auto"), "algo.ent_coef_init"),
                                           (("auto", 1.0, "high"), "algo.target_entropy")])
def test_bad_entropy_settings_are_one_line(args, key):
    with pytest.raises(ConfigError, match=key):
        check_entropy_settings(*args)
