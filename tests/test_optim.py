"""FusedAdam is torch.optim.Adam(fused=True), RMSprop is torch.optim.RMSprop and RAdam is torch.optim.RAdam, step
for step, each sharing its state_dict layout."""

import pytest
import torch
from torch import nn

from rlcli.algos.optim import FusedAdam, RAdam, RMSprop


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


def test_rmsprop_matches_torchs_exactly_with_a2cs_settings():
    ours, ref = _net(0), _net(0)
    groups = lambda n: [{"params": list(n[0].parameters()), "lr": 7e-4, "base_lr": 7e-4},  # noqa: E731
                        {"params": list(n[2].parameters()), "lr": 1e-3}]
    opt_ours = RMSprop(groups(ours), alpha=0.99, eps=1e-5)
    opt_ref = torch.optim.RMSprop(groups(ref), alpha=0.99, eps=1e-5)
    _train(ours, opt_ours, 25, lr_at=lambda i: 7e-4 * (1 - i / 25))
    _train(ref, opt_ref, 25, lr_at=lambda i: 7e-4 * (1 - i / 25))
    for a, b in zip(ours.parameters(), ref.parameters(), strict=True):
        assert torch.equal(a, b)
    for key, state in opt_ref.state_dict()["state"].items():
        mine = opt_ours.state_dict()["state"][key]
        assert float(mine["step"]) == float(state["step"]) == 25 and mine["step"].device.type == "cpu"
        assert torch.equal(mine["square_avg"], state["square_avg"])
    assert opt_ours.state_dict()["param_groups"][0]["base_lr"] == 7e-4  # a group's own keys are saved


def test_rmsprop_state_dict_round_trips_both_ways():
    ours, ref = _net(1), _net(1)
    opt_ours, opt_ref = RMSprop(ours.parameters(), lr=1e-2), torch.optim.RMSprop(ref.parameters(), lr=1e-2)
    _train(ours, opt_ours, 5)
    _train(ref, opt_ref, 5)
    ours2, ref2 = _net(9), _net(9)
    ours2.load_state_dict(ref.state_dict())
    ref2.load_state_dict(ours.state_dict())
    opt_ours2 = RMSprop(ours2.parameters(), lr=1e-2)
    opt_ours2.load_state_dict(opt_ref.state_dict())  # an older checkpoint, written by torch's RMSprop
    opt_ref2 = torch.optim.RMSprop(ref2.parameters(), lr=1e-2)
    opt_ref2.load_state_dict(opt_ours.state_dict())
    for optimizer in (opt_ours2, opt_ref2, opt_ours):
        _train(ours2 if optimizer is opt_ours2 else ref2 if optimizer is opt_ref2 else ours, optimizer, 5)
    for a, b, c in zip(ours2.parameters(), ref2.parameters(), ours.parameters(), strict=True):
        assert torch.equal(a, c) and torch.equal(b, c)


def test_radam_matches_torchs_exactly_through_its_rectification():
    """RAdam's first steps are bias-corrected momentum; from step 6 (betas' default) the rectified adaptive step:
    60 steps cover both, with two groups and a changing lr."""
    ours, ref = _net(0), _net(0)
    groups = lambda n: [{"params": list(n[0].parameters()), "lr": 2.5e-4, "base_lr": 2.5e-4},  # noqa: E731
                        {"params": list(n[2].parameters()), "lr": 1e-3}]
    opt_ours, opt_ref = RAdam(groups(ours)), torch.optim.RAdam(groups(ref))
    _train(ours, opt_ours, 60, lr_at=lambda i: 2.5e-4 * (1 - i / 60))
    _train(ref, opt_ref, 60, lr_at=lambda i: 2.5e-4 * (1 - i / 60))
    for a, b in zip(ours.parameters(), ref.parameters(), strict=True):
        assert torch.equal(a, b)
    for key, state in opt_ref.state_dict()["state"].items():
        mine = opt_ours.state_dict()["state"][key]
        assert float(mine["step"]) == float(state["step"]) == 60 and mine["step"].device.type == "cpu"
        assert torch.equal(mine["exp_avg"], state["exp_avg"]) and torch.equal(mine["exp_avg_sq"], state["exp_avg_sq"])
    assert opt_ours.state_dict()["param_groups"][0]["base_lr"] == 2.5e-4


def test_radam_state_dict_round_trips_both_ways():
    ours, ref = _net(1), _net(1)
    opt_ours, opt_ref = RAdam(ours.parameters(), lr=1e-2), torch.optim.RAdam(ref.parameters(), lr=1e-2)
    _train(ours, opt_ours, 3)  # mid-warm-up: the rectification starts after the load
    _train(ref, opt_ref, 3)
    ours2, ref2 = _net(9), _net(9)
    ours2.load_state_dict(ref.state_dict())
    ref2.load_state_dict(ours.state_dict())
    opt_ours2 = RAdam(ours2.parameters(), lr=1e-2)
    opt_ours2.load_state_dict(opt_ref.state_dict())  # an older PQN checkpoint, written by torch's RAdam
    opt_ref2 = torch.optim.RAdam(ref2.parameters(), lr=1e-2)
    opt_ref2.load_state_dict(opt_ours.state_dict())
    for optimizer in (opt_ours2, opt_ref2, opt_ours):
        _train(ours2 if optimizer is opt_ours2 else ref2 if optimizer is opt_ref2 else ours, optimizer, 8)
    for a, b, c in zip(ours2.parameters(), ref2.parameters(), ours.parameters(), strict=True):
        assert torch.equal(a, c) and torch.equal(b, c)


@pytest.mark.parametrize("algo", ["a2c", "pqn"])
def test_training_a2c_or_pqn_does_not_import_torchs_compiler(algo: str):
    """torch.optim's optimizers import torch._dynamo at their first call (1.1 s of start-up); A2C's RMSprop, PQN's
    RAdam and every Adam in rlcli are its own."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from rlcli.run.compose import compose_config\n"
            "from rlcli.run.state import prepare\n"
            f"c, _ = prepare(compose_config(['algo={algo}']))\n"
            "c.collector.collect(c.learner)\n"
            "c.algo.update(c.buffer, c.clock)\n"
            "print(type(c.algo.optimizer).__module__, 'torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["rlcli.algos.optim", "False"]
