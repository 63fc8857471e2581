"""The members' loss on their stacked rows (sweeps/population/members_loss.py): per-member means, and the first
call's check against vmap that keeps it only where the two agree bit for bit."""

from __future__ import annotations

import pytest
import torch
from torch.func import vmap

from rlcli.algos.base import masked_mean, members_first, normalize_masked
from rlcli.algos.losses import squared_value_loss
from rlcli.sweeps.population.members_loss import MembersLoss


def test_members_first_takes_each_members_own_masked_mean():
    x, mask = torch.randn(3, 5), torch.tensor([[1.0] * 5, [1, 1, 0, 0, 0], [0.0] * 5])
    with members_first():
        means = masked_mean(x, mask)
        normalized = normalize_masked(x, mask)
    assert means.shape == (3, 1)
    for m in range(3):
        assert torch.allclose(means[m, 0], masked_mean(x[m], mask[m]))
        assert torch.allclose(normalized[m], normalize_masked(x[m], mask[m]))
    assert masked_mean(x, mask).shape == ()  # outside: one mean over everything, as a single run takes it


def test_members_first_sums_value_heads_not_the_batch():
    values, returns, mask = torch.randn(2, 6, 3), torch.randn(2, 6, 3), torch.ones(2, 6)
    with members_first():
        losses = squared_value_loss(values, returns, mask)
    for m in range(2):
        assert torch.allclose(losses[m, 0], squared_value_loss(values[m], returns[m], mask[m]))


def _inputs(members: int = 4) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    batch = (torch.randn(members, 32), torch.ones(members, 32))
    evaluated = (torch.randn(members, 32, requires_grad=True),)
    return batch, evaluated, {"coef": torch.linspace(0.1, 0.4, members)}


def _per_member_loss(batch, evaluated, terms):
    (target, mask), (prediction,) = batch, evaluated
    error = masked_mean((prediction - target).square(), mask)
    loss = terms["coef"] * error + masked_mean(prediction, mask)
    return loss, {"error": error.detach()}


def _reduces_over_everything(batch, evaluated, terms):
    (target, _), (prediction,) = batch, evaluated
    error = (prediction - target).square().mean()  # not a per-member mean: over the members' axis too
    return terms["coef"] * error, {"error": error.detach()}


def test_a_loss_of_per_member_means_runs_on_the_stacked_rows_with_vmaps_numbers():
    batch, evaluated, terms = _inputs()
    calls = []
    vmapped = vmap(_per_member_loss)
    members_loss = MembersLoss(_per_member_loss, lambda *a: calls.append(1) or vmapped(*a))
    losses, stats = members_loss(batch, evaluated, terms)
    assert members_loss.direct is True and len(calls) == 1  # the first call checked against vmap
    expected, expected_stats = vmapped(batch, evaluated, terms)
    assert torch.equal(losses, expected) and torch.equal(stats["error"], expected_stats["error"])
    (grad,) = torch.autograd.grad(losses.sum(), evaluated)
    (expected_grad,) = torch.autograd.grad(expected.sum(), evaluated)
    assert torch.equal(grad, expected_grad)
    members_loss(batch, evaluated, terms)
    assert len(calls) == 1  # later calls do not go through vmap


def _one_members_shapes_only(batch, evaluated, terms):
    (target, mask), (prediction,) = batch, evaluated
    error = masked_mean((prediction - target).square(), mask)
    flat = prediction.view(32)  # one member's [32] rows: the stacked [members, 32] cannot take this view
    return terms["coef"] * error + flat.mean(), {"error": error.detach()}


@pytest.mark.parametrize("loss", [_reduces_over_everything, _one_members_shapes_only],
                         ids=["not-per-member-means", "fails-on-stacked-rows"])
def test_a_loss_that_does_not_reduce_per_member_keeps_vmap(loss):
    batch, evaluated, terms = _inputs()
    vmapped = vmap(loss)
    members_loss = MembersLoss(loss, vmapped)
    losses, stats = members_loss(batch, evaluated, terms)
    assert members_loss.direct is False
    expected, expected_stats = vmapped(batch, evaluated, terms)
    assert torch.equal(losses, expected) and torch.equal(stats["error"], expected_stats["error"])
    again, _ = members_loss(batch, evaluated, terms)
    assert torch.equal(again, expected)
