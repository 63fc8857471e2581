"""Adam as one fused kernel call per step, A2C's RMSprop and PQN's RAdam, without torch.optim's per-step Python
machinery.

torch.optim.Adam(fused=True) runs the same kernel (`torch._fused_adam_`), but its `step` wraps it
in about 170 us of Python (hooks, grouping, dynamo guards) — a tenth of a small PPO minibatch step
on a CPU — and the first optimizer call imports torch._dynamo (about 1.3 s of start-up). These classes
keep the update bit-identical to torch.optim.Adam(fused=True), torch.optim.RMSprop and torch.optim.RAdam on the
CPU (tests check it) and use the same state_dict layout, so checkpoints load in either. Only what rlcli uses: no
weight decay, amsgrad or maximize; RMSprop without momentum or centering.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import torch

# What torch.optim.Adam keeps in each param group: saved too, so that it can load our checkpoints.
TORCH_GROUP_KEYS = {"weight_decay": 0.0, "amsgrad": False, "maximize": False, "foreach": None, "capturable": False,
                    "differentiable": False, "fused": True, "decoupled_weight_decay": False}


# torch.optim.RMSprop's group keys beyond rlcli's (the ones our RMSprop keeps: lr, alpha, eps and the settings it
# refuses to change, which algos/compiled.py's rule reads)
TORCH_RMSPROP_GROUP_KEYS = {"capturable": False, "foreach": None, "differentiable": False}

# torch.optim.RAdam's group keys beyond lr, betas, eps and the ones our RAdam refuses to change
TORCH_RADAM_GROUP_KEYS = {"foreach": None, "capturable": False, "differentiable": False}


def fused_adam_available() -> bool:
    return hasattr(torch, "_fused_adam_")


class FusedAdam:
    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        self.defaults = {"lr": lr, "betas": tuple(betas), "eps": eps}
        self.param_groups = groups_with_defaults(params, self.defaults)
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        zero_grads(self.param_groups, set_to_none)

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

    def state_dict(self) -> dict[str, Any]:
        return layout_state_dict(self.param_groups, self.state, TORCH_GROUP_KEYS)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.state = load_layout(self.param_groups, state_dict, TORCH_GROUP_KEYS, ("exp_avg", "exp_avg_sq"),
                                 step_on_cpu=False)


class RMSprop:
    """torch.optim.RMSprop without momentum, centering or weight decay (A2C's, SB3's TF-like settings), step for
    step as torch computes it on the CPU, with the same state_dict layout. torch.optim's optimizers import
    torch._dynamo at their first call (1.1 s of an A2C run's start-up here) and wrap each step in their
    per-step Python machinery; a test holds this one to torch's numbers bit for bit."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8) -> None:
        self.defaults = {"lr": lr, "alpha": alpha, "eps": eps, "momentum": 0, "centered": False,
                         "weight_decay": 0, "maximize": False}
        self.param_groups = groups_with_defaults(params, self.defaults)
        self.state: defaultdict[torch.Tensor, dict[str, torch.Tensor]] = defaultdict(dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        zero_grads(self.param_groups, set_to_none)

    def _state(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        state = self.state[p]
        if not state:  # as torch.optim.RMSprop (not capturable): a float32 step counter on the CPU
            state["step"] = torch.zeros((), dtype=torch.float32)
            state["square_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            states = [self._state(p) for p in params]
            torch._foreach_add_([s["step"] for s in states], 1)
            rmsprop_update(params, [p.grad for p in params], [s["square_avg"] for s in states], group["lr"],
                           group["alpha"], group["eps"])

    def state_dict(self) -> dict[str, Any]:
        return layout_state_dict(self.param_groups, self.state, TORCH_RMSPROP_GROUP_KEYS)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.state = defaultdict(dict, load_layout(self.param_groups, state_dict, TORCH_RMSPROP_GROUP_KEYS,
                                                   ("square_avg",), step_on_cpu=True))


def rmsprop_update(params: list[torch.Tensor], grads: list[torch.Tensor], square_avgs: list[torch.Tensor], lr: float,
                   alpha: float, eps: float) -> None:
    """RMSprop's step on these tensors (no momentum, centering or weight decay), as torch computes it on the CPU:
    `RMSprop.step`'s arithmetic, and a population's members' step over their stacked weights."""
    torch._foreach_mul_(square_avgs, alpha)
    torch._foreach_addcmul_(square_avgs, grads, grads, value=1 - alpha)
    avg = torch._foreach_sqrt(square_avgs)
    torch._foreach_add_(avg, eps)
    torch._foreach_addcdiv_(params, grads, avg, value=-lr)


class RAdam:
    """torch.optim.RAdam without weight decay (PQN's, as CleanRL's), operation for operation as torch computes it
    on the CPU (its single-tensor path; on a GPU torch takes a multi-tensor path whose rounding may differ), with
    the same state_dict layout. As RMSprop above: torch's optimizer would import torch._dynamo at its first call
    (1.1 s of a PQN run's start-up) and wrap each step in its Python machinery."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        self.defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": 0, "maximize": False,
                         "decoupled_weight_decay": False}
        self.param_groups = groups_with_defaults(params, self.defaults)
        self.state: defaultdict[torch.Tensor, dict[str, torch.Tensor]] = defaultdict(dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        zero_grads(self.param_groups, set_to_none)

    def _state(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        state = self.state[p]
        if not state:  # as torch.optim.RAdam (not capturable): a float32 step counter on the CPU
            state["step"] = torch.tensor(0.0, dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self._state(p)
                state["step"] += 1
                radam_update(p, p.grad, state["exp_avg"], state["exp_avg_sq"], state["step"].item(), group["lr"],
                             beta1, beta2, group["eps"])

    def state_dict(self) -> dict[str, Any]:
        return layout_state_dict(self.param_groups, self.state, TORCH_RADAM_GROUP_KEYS)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.state = defaultdict(dict, load_layout(self.param_groups, state_dict, TORCH_RADAM_GROUP_KEYS,
                                                   ("exp_avg", "exp_avg_sq"), step_on_cpu=True))


def radam_update(p: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, step: float,
                 lr: float, beta1: float, beta2: float, eps: float) -> None:
    """RAdam's step of one tensor at this step count (already advanced), operation for operation as torch's
    single-tensor path: `RAdam.step`'s arithmetic, and a population's members' step over their stacked weights
    (torch's scalars here are Python floats, as `step` is)."""
    rho_inf = 2 / (1 - beta2) - 1  # the approximated SMA's longest length
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    bias_corrected_exp_avg = exp_avg / bias_correction1
    rho_t = rho_inf - 2 * step * (beta2**step) / bias_correction2
    if rho_t > 5.0:  # the variance is tractable: the rectified adaptive step
        adaptive_lr = (bias_correction2**0.5) / exp_avg_sq.sqrt().add_(eps)
        rect = ((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
        p.add_(bias_corrected_exp_avg * lr * adaptive_lr * rect, alpha=-1.0)
    else:  # the first steps: bias-corrected momentum alone
        p.add_(bias_corrected_exp_avg * lr, alpha=-1.0)


def groups_with_defaults(params: Iterable[Any], defaults: dict[str, Any]) -> list[dict[str, Any]]:
    """torch.optim's parameter groups: a plain list of parameters is one group, and each group's settings default
    to the optimizer's."""
    params = list(params)
    groups = params if params and isinstance(params[0], dict) else [{"params": params}]
    return [{**defaults, **group, "params": list(group["params"])} for group in groups]


def zero_grads(param_groups: list[dict[str, Any]], set_to_none: bool) -> None:
    for group in param_groups:
        for p in group["params"]:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()


# torch.optim's layout: {"state": {index: {...}}, "param_groups": [{..., "params": [indices]}]}
def layout_state_dict(param_groups: list[dict[str, Any]], state: dict[torch.Tensor, dict[str, torch.Tensor]],
                      torch_keys: dict[str, Any]) -> dict[str, Any]:
    """An optimizer's state as torch.optim saves it (`torch_keys`: the group keys torch saves that we do not use),
    so that torch's optimizer of the same kind loads it."""
    index: dict[int, int] = {}
    groups = []
    for group in param_groups:
        ids = []
        for p in group["params"]:
            index.setdefault(id(p), len(index))
            ids.append(index[id(p)])
        groups.append({**torch_keys, **{k: v for k, v in group.items() if k != "params"}, "params": ids})
    saved = {index[id(p)]: {k: v.clone() for k, v in state[p].items()}
             for group in param_groups for p in group["params"] if p in state and state[p]}
    return {"state": saved, "param_groups": groups}


def load_layout(param_groups: list[dict[str, Any]], state_dict: dict[str, Any], torch_keys: dict[str, Any],
                slots: tuple[str, ...], step_on_cpu: bool) -> dict[torch.Tensor, dict[str, torch.Tensor]]:
    """The per-parameter state in a torch.optim-layout state_dict (ours or torch's), with the saved group settings
    written into `param_groups`. Each step counter goes where its optimizer keeps it: on the CPU (torch's RMSprop)
    or on the parameter's device (fused Adam)."""
    saved_groups = state_dict["param_groups"]
    if len(saved_groups) != len(param_groups) or any(
            len(s["params"]) != len(g["params"]) for s, g in zip(saved_groups, param_groups, strict=True)):
        raise ValueError("the saved optimizer state does not match this optimizer's parameter groups")
    state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}
    for saved, group in zip(saved_groups, param_groups, strict=True):
        for key, value in saved.items():
            if key != "params" and key not in torch_keys:
                group[key] = tuple(value) if key == "betas" else value
        for i, p in zip(saved["params"], group["params"], strict=True):
            entry = state_dict["state"].get(i, state_dict["state"].get(str(i)))
            if entry is not None:
                step = torch.as_tensor(entry["step"], dtype=torch.float32)
                state[p] = {"step": (step if step_on_cpu else step.to(p.device)).clone(),
                            **{slot: entry[slot].to(device=p.device, dtype=p.dtype).clone() for slot in slots}}
    return state
