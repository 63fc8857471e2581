"""Adam as one fused kernel call per step, without torch.optim's per-step Python machinery.

torch.optim.Adam(fused=True) runs the same kernel (`torch._fused_adam_`), but its `step` wraps it
in about 170 us of Python (hooks, grouping, dynamo guards) — a tenth of a small PPO minibatch step
on a CPU — and the first optimizer call imports torch._dynamo (about 1.3 s of start-up). This class
keeps the update bit-identical to torch.optim.Adam(fused=True) (a test checks it) and uses the same
state_dict layout, so checkpoints load in either. Only what rlcli uses: no weight decay, amsgrad or
maximize.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

# What torch.optim.Adam keeps in each param group: saved too, so that it can load our checkpoints.
TORCH_GROUP_KEYS = {"weight_decay": 0.0, "amsgrad": False, "maximize": False, "foreach": None, "capturable": False,
                    "differentiable": False, "fused": True, "decoupled_weight_decay": False}


def fused_adam_available() -> bool:
    return hasattr(torch, "_fused_adam_")


class FusedAdam:
    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        params = list(params)
        groups = params if params and isinstance(params[0], dict) else [{"params": params}]
        self.defaults = {"lr": lr, "betas": tuple(betas), "eps": eps}
        self.param_groups: list[dict[str, Any]] = []
        for group in groups:
            entry = {**self.defaults, **group}
            entry["params"] = list(group["params"])
            self.param_groups.append(entry)
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()

    def _state(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        state = self.state.get(p)
        if state is None:  # as torch.optim.Adam: a float32 step counter on the parameter's device
            state = {"step": torch.tensor(0.0, dtype=torch.float32, device=p.device),
                     "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                     "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
            self.state[p] = state
        return state

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            states = [self._state(p) for p in params]
            steps = [s["step"] for s in states]
            torch._foreach_add_(steps, 1)
            beta1, beta2 = group["betas"]
            torch._fused_adam_(
                params, [p.grad for p in params], [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                [], steps, lr=group["lr"], beta1=beta1, beta2=beta2, weight_decay=0.0, eps=group["eps"],
                amsgrad=False, maximize=False,
            )

    # torch.optim's layout: {"state": {index: {...}}, "param_groups": [{..., "params": [indices]}]}
    def state_dict(self) -> dict[str, Any]:
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            ids = []
            for p in group["params"]:
                index.setdefault(id(p), len(index))
                ids.append(index[id(p)])
            groups.append({**TORCH_GROUP_KEYS, **{k: v for k, v in group.items() if k != "params"}, "params": ids})
        state = {}
        for group in self.param_groups:
            for p in group["params"]:
                if p in self.state:
                    state[index[id(p)]] = {k: v.clone() for k, v in self.state[p].items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups) or any(
                len(s["params"]) != len(g["params"]) for s, g in zip(saved_groups, self.param_groups, strict=True)):
            raise ValueError("the saved optimizer state does not match this optimizer's parameter groups")
        self.state = {}
        for saved, group in zip(saved_groups, self.param_groups, strict=True):
            for key, value in saved.items():
                if key != "params" and key not in TORCH_GROUP_KEYS:
                    group[key] = tuple(value) if key == "betas" else value
            for i, p in zip(saved["params"], group["params"], strict=True):
                entry = state_dict["state"].get(i, state_dict["state"].get(str(i)))
                if entry is not None:
                    self.state[p] = {
                        "step": torch.as_tensor(entry["step"], dtype=torch.float32).to(p.device).clone(),
                        "exp_avg": entry["exp_avg"].to(device=p.device, dtype=p.dtype).clone(),
                        "exp_avg_sq": entry["exp_avg_sq"].to(device=p.device, dtype=p.dtype).clone(),
                    }


def step_together(optimizers: Sequence[Any]) -> None:
    """Step several optimizers (a population's members) as a single run steps each: FusedAdam groups with the
    same settings go to the fused kernel in one call (it is elementwise, so the result is each member's own
    step, bit for bit); any other optimizer steps on its own."""
    calls: dict[tuple[float, tuple[float, float], float], list[tuple[Any, dict[str, Any]]]] = {}
    for optimizer in optimizers:
        if not isinstance(optimizer, FusedAdam):
            optimizer.step()
            continue
        for group in optimizer.param_groups:
            calls.setdefault((group["lr"], tuple(group["betas"]), group["eps"]), []).append((optimizer, group))
    with torch.no_grad():
        for (lr, (beta1, beta2), eps), groups in calls.items():
            params = [p for optimizer, group in groups for p in group["params"] if p.grad is not None]
            states = [optimizer._state(p) for optimizer, group in groups for p in group["params"]
                      if p.grad is not None]
            if not params:
                continue
            steps = [s["step"] for s in states]
            torch._foreach_add_(steps, 1)
            torch._fused_adam_(
                params, [p.grad for p in params], [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                [], steps, lr=lr, beta1=beta1, beta2=beta2, weight_decay=0.0, eps=eps, amsgrad=False,
                maximize=False,
            )
