"""PPO's clipped surrogate and clipped value loss against a plain per-element reference."""

import math
import random

import pytest
import torch

from rlcli.algos.losses import clipped_surrogate_loss, policy_gradient_loss, squared_value_loss


def reference_surrogate(adv, ratio, clip, mask):
    terms = []
    for a, r, m in zip(adv, ratio, mask, strict=True):
        if not m:
            continue
        if clip is None:
            terms.append(-a * r)
        else:
            clipped_r = min(max(r, 1 - clip), 1 + clip)
            terms.append(max(-a * r, -a * clipped_r))
    return sum(terms) / len(terms)


def reference_value(values, old, returns, clip_vf, mask):
    terms = []
    for v, o, g, m in zip(values, old, returns, mask, strict=True):
        if not m:
            continue
        err = (v - g) ** 2
        if clip_vf is not None:
            vc = o + min(max(v - o, -clip_vf), clip_vf)
            err = max(err, (vc - g) ** 2)
        terms.append(err)
    return sum(terms) / len(terms)


@pytest.mark.parametrize("clip", [0.2, 0.05, None])
def test_clipped_surrogate_matches_reference(clip):
    rng = random.Random(0)
    n = 64
    adv = [rng.gauss(0, 1) for _ in range(n)]
    ratio = [math.exp(rng.gauss(0, 0.3)) for _ in range(n)]  # many outside [0.8, 1.2]
    mask = [rng.random() > 0.2 for _ in range(n)]
    got = clipped_surrogate_loss(torch.tensor(adv, dtype=torch.float64), torch.tensor(ratio, dtype=torch.float64),
                                 clip, torch.tensor(mask, dtype=torch.float64))
    assert got.item() == pytest.approx(reference_surrogate(adv, ratio, clip, mask), rel=1e-12)


def test_surrogate_gradient_is_zero_where_the_clip_binds():
    # A > 0 and r > 1 + c: the clipped term is the max, so the ratio gets no gradient there.
    ratio = torch.tensor([1.5, 1.0], requires_grad=True)
    loss = clipped_surrogate_loss(torch.tensor([1.0, 1.0]), ratio, 0.2, torch.ones(2))
    loss.backward()
    assert ratio.grad[0].item() == 0.0 and ratio.grad[1].item() == pytest.approx(-0.5)


@pytest.mark.parametrize("clip_vf", [0.1, 1.0, None])
def test_clipped_value_loss_matches_reference(clip_vf):
    rng = random.Random(1)
    n = 50
    values = [rng.gauss(0, 1) for _ in range(n)]
    old = [v + rng.gauss(0, 0.5) for v in values]
    returns = [rng.gauss(0, 2) for _ in range(n)]
    mask = [rng.random() > 0.1 for _ in range(n)]
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    got = squared_value_loss(t(values), t(returns), t(mask), t(old), clip_vf)
    assert got.item() == pytest.approx(reference_value(values, old, returns, clip_vf, mask), rel=1e-12)


def test_value_loss_sums_several_heads():
    values, old, returns = torch.randn(10, 2), torch.randn(10, 2), torch.randn(10, 2)
    mask = torch.ones(10)
    both = squared_value_loss(values, returns, mask, old, 0.2)
    each = sum(squared_value_loss(values[:, i], returns[:, i], mask, old[:, i], 0.2) for i in range(2))
    assert both.item() == pytest.approx(each.item(), rel=1e-6)


def test_policy_gradient_loss_is_minus_the_masked_mean_of_advantage_times_log_prob():
    adv = torch.tensor([[1.0, -2.0], [0.5, 3.0]], dtype=torch.float64)
    logp = torch.tensor([[-0.1, -1.0], [-2.0, -0.3]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)  # the last step is padding
    expected = -(1.0 * -0.1 + -2.0 * -1.0 + 0.5 * -2.0) / 3
    assert policy_gradient_loss(adv, logp, mask).item() == pytest.approx(expected)
