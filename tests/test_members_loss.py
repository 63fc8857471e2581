"""The members' loss on their stacked rows (sweeps/population/lockstep.py, acting.CheckedFastPath): per-member
means, and the first call's check against vmap that keeps it only where the two agree bit for bit."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch.func import vmap

from rlcli.algos.base import masked_mean, members_first, normalize_masked
from rlcli.algos.losses import squared_value_loss
from rlcli.sweeps.population.acting import CheckedFastPath, same, same_losses
from rlcli.sweeps.population.lockstep import _rows_loss


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


def _inputs(members: int = 4) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    return torch.randn(members, 32), torch.ones(members, 32), torch.randn(members, 32, requires_grad=True), \
        torch.linspace(0.1, 0.4, members)


def _per_member_loss(target, mask, prediction, coef):
    error = masked_mean((prediction - target).square(), mask)
    loss = coef * error + masked_mean(prediction, mask)
    return loss, {"error": error.detach()}


def _reduces_over_everything(target, mask, prediction, coef):
    error = (prediction - target).square().mean()  # not a per-member mean: over the members' axis too
    return coef * error, {"error": error.detach()}


def _one_members_shapes_only(target, mask, prediction, coef):
    error = masked_mean((prediction - target).square(), mask)
    flat = prediction.view(32)  # one member's [32] rows: the stacked [members, 32] cannot take this view
    return coef * error + flat.mean(), {"error": error.detach()}


def _members_loss(loss):
    """The population's eager loss as lockstep.py builds it (no layers to swap here): the loss on the stacked rows,
    checked at its first call against vmap's, with the gradients with respect to the prediction."""
    return CheckedFastPath(partial(_rows_loss, loss, [], 4), shape_errors=(RuntimeError, IndexError, ValueError))


def test_a_loss_of_per_member_means_runs_on_the_stacked_rows_with_vmaps_numbers():
    args = _inputs()
    calls = []
    vmapped = vmap(_per_member_loss)
    members_loss = _members_loss(_per_member_loss)
    def slow():
        calls.append(1)
        return vmapped(*args)

    losses, stats = members_loss(slow, partial(same_losses, inputs=args[2:3]), *args)
    assert members_loss.fast is not None and len(calls) == 1  # the first call checked against vmap
    expected, expected_stats = vmapped(*args)
    assert torch.equal(losses, expected) and torch.equal(stats["error"], expected_stats["error"])
    (grad,) = torch.autograd.grad(losses.sum(), args[2])
    (expected_grad,) = torch.autograd.grad(expected.sum(), args[2])
    assert torch.equal(grad, expected_grad)
    members_loss(slow, partial(same_losses, inputs=args[2:3]), *args)
    assert len(calls) == 1  # later calls do not go through vmap


@pytest.mark.parametrize("loss", [_reduces_over_everything, _one_members_shapes_only],
                         ids=["not-per-member-means", "fails-on-stacked-rows"])
def test_a_loss_that_does_not_reduce_per_member_keeps_vmap(loss):
    args = _inputs()
    vmapped = vmap(loss)
    members_loss = _members_loss(loss)
    losses, stats = members_loss(partial(vmapped, *args), partial(same_losses, inputs=args[2:3]), *args)
    assert members_loss.fast is None
    expected, expected_stats = vmapped(*args)
    assert torch.equal(losses, expected) and torch.equal(stats["error"], expected_stats["error"])
    again, _ = members_loss(partial(vmapped, *args), partial(same_losses, inputs=args[2:3]), *args)
    assert torch.equal(again, expected)


def test_the_check_compares_gradients_too():
    """A fast way whose values agree but whose gradients do not is dropped (the step's backward would differ)."""
    args = _inputs()

    def detached_inside(target, mask, prediction, coef):  # same values, no gradient through the error term
        loss, stats = _per_member_loss(target, mask, prediction, coef)
        return loss.detach() + (prediction * 0).sum(-1, keepdim=True), stats

    vmapped = vmap(_per_member_loss)
    values_only = CheckedFastPath(partial(_rows_loss, detached_inside, [], 4))
    values_only(partial(vmapped, *args), same, *args)
    assert values_only.fast is not None  # the values alone agree
    members_loss = CheckedFastPath(partial(_rows_loss, detached_inside, [], 4))
    members_loss(partial(vmapped, *args), partial(same_losses, inputs=args[2:3]), *args)
    assert members_loss.fast is None


def test_a_fast_way_that_fails_is_vmaps_only_where_its_errors_say_so():
    """Acting takes no shape errors: a fast way that raises is a fault, raised (not a silent slowdown); a checked fast
    way that no longer applies (None) hands over to vmap for good."""
    def broken(x):
        raise RuntimeError("a broken stand-in")

    with pytest.raises(RuntimeError, match="a broken stand-in"):
        CheckedFastPath(broken)(lambda: 0, same, torch.zeros(1))
    calls = []

    def applies_once(x):
        calls.append(1)
        return x if len(calls) == 1 else None

    path = CheckedFastPath(applies_once)
    assert torch.equal(path(lambda: torch.ones(1), same, torch.ones(1)), torch.ones(1)) and path.fast is not None
    assert torch.equal(path(lambda: torch.full((1,), 2.0), same, torch.ones(1)), torch.full((1,), 2.0))
    assert path.fast is None
