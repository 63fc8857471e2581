"""FusedAdam is torch.optim.Adam(fused=True), step for step, and shares its state_dict layout."""

import torch
from torch import nn

from rlcli.algos.optim import FusedAdam


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))


def _train(net: nn.Module, opt, steps: int, lr_at=None) -> None:
    torch.manual_seed(123)
    for i in range(steps):
        if lr_at is not None:
            for g in opt.param_groups:
                g["lr"] = lr_at(i)
        x = torch.randn(32, 4)
        loss = net(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_matches_torch_fused_adam_exactly():
    ours, ref = _net(0), _net(0)
    groups = lambda n: [{"params": list(n[0].parameters()), "lr": 1e-3},  # noqa: E731
                        {"params": list(n[2].parameters()), "lr": 3e-3}]
    opt_ours = FusedAdam(groups(ours), eps=1e-5)
    opt_ref = torch.optim.Adam(groups(ref), eps=1e-5, fused=True)
    _train(ours, opt_ours, 25, lr_at=lambda i: 1e-3 * (1 - i / 25))
    _train(ref, opt_ref, 25, lr_at=lambda i: 1e-3 * (1 - i / 25))
    for a, b in zip(ours.parameters(), ref.parameters(), strict=True):
        assert torch.equal(a, b)


def test_state_dict_round_trips_both_ways():
    ours, ref = _net(1), _net(1)
    opt_ours, opt_ref = FusedAdam(ours.parameters(), lr=1e-2), torch.optim.Adam(ref.parameters(), lr=1e-2, fused=True)
    _train(ours, opt_ours, 5)
    _train(ref, opt_ref, 5)
    # continue each from the other's saved state: identical results
    ours2, ref2 = _net(9), _net(9)
    ours2.load_state_dict(ref.state_dict())
    ref2.load_state_dict(ours.state_dict())
    opt_ours2 = FusedAdam(ours2.parameters(), lr=1e-2)
    opt_ours2.load_state_dict(opt_ref.state_dict())
    opt_ref2 = torch.optim.Adam(ref2.parameters(), lr=1e-2, fused=True)
    opt_ref2.load_state_dict(opt_ours.state_dict())
    _train(ours2, opt_ours2, 5)
    _train(ref2, opt_ref2, 5)
    _train(ours, opt_ours, 5)
    for a, b in zip(ours2.parameters(), ours.parameters(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(ref2.parameters(), ours.parameters(), strict=True):
        assert torch.equal(a, b)
