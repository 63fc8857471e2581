"""The members' optimizer step over the stacked weights (sweeps/population/optimizer_states.StackedStep) against
each member's own FusedAdam, RMSprop or RAdam, and its fall-backs: members stepping apart, different settings, a state
loaded anew."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

from rlcli.algos.optim import FusedAdam, RAdam, RMSprop
from rlcli.sweeps.population.optimizer_states import StackedStep
from rlcli.sweeps.population.stacking import stack_weights, step_members

OPTIMIZERS = {"adam": (FusedAdam, {"eps": 1e-5}, ("step", "exp_avg", "exp_avg_sq")),
              "rmsprop": (RMSprop, {"alpha": 0.99, "eps": 1e-5}, ("step", "square_avg")),  # A2C's (SB3's TF-like eps)
              "radam": (RAdam, {"eps": 1e-5}, ("step", "exp_avg", "exp_avg_sq"))}  # PQN's


def _members(count: int = 3, lrs: tuple[float, ...] = (), kind: str = "adam") -> tuple[list[nn.Module], list[Any]]:
    torch.manual_seed(0)
    # weights of 64 and 128 floats a member step stacked whole, biases of 16 and 8 row by row (WHOLE_ROWS)
    nets = [nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 8)) for _ in range(count)]
    optimizer, settings, _ = OPTIMIZERS[kind]
    optimizers = [optimizer([{"params": net[0].parameters()}, {"params": net[2].parameters(), "lr": 3e-3}],
                            lr=lrs[m] if lrs else 1e-3, **settings) for m, net in enumerate(nets)]
    return nets, optimizers


def _own_steps(nets: list[nn.Module], optimizers: list[Any], batches: list[torch.Tensor],
               stepping: list[list[int]]) -> None:
    """Each member alone, as its single run steps: zero_grad, backward, its own optimizer."""
    for members, x in zip(stepping, batches, strict=True):
        for m in members:
            optimizers[m].zero_grad()
            nets[m](x[m]).square().mean().backward()
            optimizers[m].step()


def _population_steps(nets: list[nn.Module], optimizers: list[Any], batches: list[torch.Tensor],
                      stepping: list[list[int]]) -> StackedStep:
    params, _ = stack_weights(nets)
    for p in params.values():
        p.requires_grad_(True)
    rows = {name: [net.get_parameter(name) for net in nets] for name in params}
    together = StackedStep(params, rows, optimizers)
    for members, x in zip(stepping, batches, strict=True):
        losses = torch.stack([torch.func.functional_call(nets[0], {k: v[m] for k, v in params.items()}, (x[m],))
                              .square().mean() for m in range(len(nets))])
        step_members(params, losses, rows, members, None, [optimizers[m] for m in members], together)
    return together


def _batches(count: int, steps: int) -> list[torch.Tensor]:
    torch.manual_seed(1)
    return [torch.randn(count, 16, 4) for _ in range(steps)]


@pytest.mark.parametrize("kind", list(OPTIMIZERS))
@pytest.mark.parametrize("stepping", [[[0, 1, 2]] * 4, [[0, 1, 2], [0, 2], [0, 1, 2], [1], [0, 1, 2]]],
                         ids=["all-together", "some-apart"])
def test_members_step_as_their_own_optimizer_would(stepping, kind):
    nets, optimizers = _members(kind=kind)
    own_nets, own_optimizers = copy.deepcopy((nets, optimizers))
    batches = _batches(3, len(stepping))
    _own_steps(own_nets, own_optimizers, batches, stepping)
    together = _population_steps(nets, optimizers, batches, stepping)
    for net, own in zip(nets, own_nets, strict=True):  # bit for bit: each row saw its own call's arithmetic
        for mine, theirs in zip(net.parameters(), own.parameters(), strict=True):
            assert torch.equal(mine, theirs)
    for optimizer, own in zip(optimizers, own_optimizers, strict=True):
        mine, theirs = optimizer.state_dict(), own.state_dict()
        for key, state in theirs["state"].items():
            for slot in OPTIMIZERS[kind][2]:
                assert torch.equal(mine["state"][key][slot], state[slot])
    # Adam's fused kernel steps the rows of the small biases apart (WHOLE_ROWS); RMSprop and RAdam every weight whole
    assert together.whole == ([True, False, True, False] if kind == "adam" else [True] * 4)
    if all(len(members) == 3 for members in stepping):  # one fused call each time: no member was handed its rows
        assert together.counts_equal is True
        assert all(p.grad is None for net in nets for p in net.parameters())
    # each member's state is a view of its row of the stacked state: a checkpoint saves what the step wrote
    first = optimizers[1]._state(nets[1][0].weight)[OPTIMIZERS[kind][2][1]]
    assert first.untyped_storage().data_ptr() == together.states.slots[0][0].untyped_storage().data_ptr()


@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_members_with_different_learning_rates_step_their_own_optimizers(kind):
    nets, optimizers = _members(lrs=(1e-3, 1e-3, 3e-4), kind=kind)
    own_nets, own_optimizers = copy.deepcopy((nets, optimizers))
    batches = _batches(3, 2)
    _own_steps(own_nets, own_optimizers, batches, [[0, 1, 2]] * 2)
    together = _population_steps(nets, optimizers, batches, [[0, 1, 2]] * 2)
    assert together.step([0, 1, 2]) is False  # not shared: the lr differs
    for net, own in zip(nets, own_nets, strict=True):
        for mine, theirs in zip(net.parameters(), own.parameters(), strict=True):
            assert torch.equal(mine, theirs)


def test_a_state_loaded_anew_is_stacked_again_before_the_next_step():
    nets, optimizers = _members()
    batches = _batches(3, 3)
    together = _population_steps(nets, optimizers, batches[:2], [[0, 1, 2]] * 2)
    saved = copy.deepcopy(optimizers[2].state_dict())
    _population_steps_again(together, nets, optimizers, batches[2:])
    optimizers[2].load_state_dict(saved)  # a rollback: member 2's Adam state as it was two steps in
    assert optimizers[2]._state(nets[2][0].weight)["exp_avg"].untyped_storage().data_ptr() != \
        together.states.slots[0][0].untyped_storage().data_ptr()
    # the counts now differ (member 2 at 2 steps, the others at 3): the members step apart, on the stacked state
    params = dict(zip(together.names, together.params, strict=True))
    for p in params.values():
        p.grad = torch.ones_like(p)
    assert together.step([0, 1, 2]) is False
    assert optimizers[2]._state(nets[2][0].weight)["exp_avg"].untyped_storage().data_ptr() == \
        together.states.slots[0][0].untyped_storage().data_ptr()
    assert torch.equal(together.states.steps[:, 2], torch.full((len(together.names),), 2.0))
    assert torch.equal(together.states.steps[:, 0], torch.full((len(together.names),), 3.0))


def _population_steps_again(together: StackedStep, nets: list[nn.Module], optimizers: list[Any],
                            batches: list[torch.Tensor]) -> None:
    params = dict(zip(together.names, together.params, strict=True))
    rows = {name: [net.get_parameter(name) for net in nets] for name in params}
    for x in batches:
        losses = torch.stack([torch.func.functional_call(nets[0], {k: v[m] for k, v in params.items()}, (x[m],))
                              .square().mean() for m in range(len(nets))])
        step_members(params, losses, rows, [0, 1, 2], None, optimizers, together)


def test_it_steps_only_the_optimizers_it_knows_and_one_kind_at_a_time():
    nets, adams = _members()
    _, rmsprops = _members(kind="rmsprop")
    _, radams = _members(kind="radam")
    assert StackedStep.fits(adams) and StackedStep.fits(rmsprops) and StackedStep.fits(radams)
    assert not StackedStep.fits([*adams[:2], rmsprops[2]])
    assert not StackedStep.fits([torch.optim.Adam(net.parameters()) for net in nets])  # torch's own: apart


def test_radam_members_match_past_the_first_steps_into_the_rectified_step():
    """RAdam's first steps (the variance not yet tractable) take momentum alone; from about the sixth on
    (beta2 0.999) the rectified adaptive step, which the all-together case above does not reach."""
    nets, optimizers = _members(kind="radam")
    own_nets, own_optimizers = copy.deepcopy((nets, optimizers))
    stepping = [[0, 1, 2]] * 9
    batches = _batches(3, len(stepping))
    _own_steps(own_nets, own_optimizers, batches, stepping)
    _population_steps(nets, optimizers, batches, stepping)
    for net, own in zip(nets, own_nets, strict=True):
        for mine, theirs in zip(net.parameters(), own.parameters(), strict=True):
            assert torch.equal(mine, theirs)
