"""The members' acting forward without vmap, for networks built of linear layers (and layer norms: PQN's): each
`nn.Linear` of one member's module is swapped, for the call, for one batched product over the stacked weights of all
members (each `nn.LayerNorm` for the normalization with every member's own scale and shift), and the member's own
code runs on [members, envs, ...] inputs.

Why: acting runs once per env step, on a handful of observations. vmap over `functional_call` spends ~0.4 ms per
call in its own Python (8 PPO CartPole members: 0.48 ms a step, against 0.10 ms for the same products written
out), which over a 100k-step run is ~5 s of a population's time. The products are vmap's own (its rule for a linear
layer is this batched product), and the first call checks that: it runs both ways and keeps the fast one only if
the results are equal bit for bit; otherwise every call goes through vmap. A population's eager loss takes the same
swap (lockstep.py), checked against vmap the same way (`CheckedFastPath`, with the gradients).

`MembersActing`: an on-policy population's acting, the networks' `policy_and_values` for all members in one call,
then each member's draw from its own stream and, for categorical heads, every member's sampling in one `act_on`
call.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

import torch
from torch import nn

from rlcli.actors.normalizer import RunningNorm
from rlcli.algos.compiled import NetworksCall
from rlcli.contracts import ActOutput
from rlcli.sweeps.population.stacking import vmapped

Swap = tuple[nn.Module, str, nn.Module, nn.Module]  # (parent, child's name, the member's child, its stand-in)


class _MembersLinear(nn.Module):
    """One linear layer of every member: [members, ..., in] -> [members, ..., out]."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.stacked_weight, self.stacked_bias = weight, bias
        self._take_views()

    def _take_views(self) -> None:
        """The weights in the form the product takes, as views taken once: the weights are stepped in place, so the
        views stay current. Per call they cost ~5 us an acting step and ~20 us an update's forward and backward
        (4 PPO members, 64x64), for every layer."""
        with torch.inference_mode(False):  # never inference tensors: an update's backward reads them
            self._weight_t = self.stacked_weight.transpose(1, 2)
            self._bias_row = None if self.stacked_bias is None else self.stacked_bias.unsqueeze(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._weight_t.requires_grad != self.stacked_weight.requires_grad:
            self._take_views()  # taken before the weights required gradients: again, so that gradients reach them
        flat = x if x.dim() == 3 else x.reshape(x.shape[0], -1, x.shape[-1])
        weight, bias = self._weight_t, self._bias_row
        out = torch.bmm(flat, weight) if bias is None else torch.baddbmm(bias, flat, weight)
        return out if x.dim() == 3 else out.reshape(*x.shape[:-1], out.shape[-1])


class _MembersLayerNorm(nn.Module):
    """One layer norm of every member: the normalization over the last dims, then each member's own affine."""

    def __init__(self, norm: nn.LayerNorm, weight: torch.Tensor | None, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.shape, self.eps = tuple(norm.normalized_shape), norm.eps
        self.stacked_weight, self.stacked_bias = weight, bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = nn.functional.layer_norm(x, self.shape, None, None, self.eps)
        middle = [1] * (x.dim() - 1 - len(self.shape))  # the members' rows broadcast over the envs' dims
        if self.stacked_weight is not None:
            out = out * self.stacked_weight.reshape(x.shape[0], *middle, *self.shape)
        if self.stacked_bias is not None:
            out = out + self.stacked_bias.reshape(x.shape[0], *middle, *self.shape)
        return out


class CheckedFastPath:
    """vmap's results for all members by a faster way, kept only where its first call agrees with vmap's bit for bit
    (the module docstring): `fast(*args)`, or None where it does not apply, against `slow()`. `shape_errors`: the
    errors that say, at the first call only, that `fast` does not apply (a loss written for one member's shapes);
    any other, or one later, is raised."""

    def __init__(self, fast: Callable[..., Any] | None, shape_errors: tuple[type[Exception], ...] = ()) -> None:
        self.fast = fast  # None: vmap's, always
        self.shape_errors = shape_errors
        self.checked = False

    def __call__(self, slow: Callable[[], Any], same: Callable[[Any, Any], bool], *args: Any) -> Any:
        if self.fast is None:
            return slow()
        if self.checked:
            out = self.fast(*args)
            if out is not None:
                return out
            self.fast = None  # it no longer applies (a loss whose shapes changed): vmap's from here on
            return slow()
        try:
            out = self.fast(*args)
        except self.shape_errors:  # code written for one member's shapes only: vmap's (a real fault in it shows
            out = None  # again under vmap, just below)
        expected, self.checked = slow(), True
        if out is None or not same(out, expected):
            self.fast = None
            return expected
        return out


def call_swapped(swaps: list[Swap], call: Callable[..., Any], *args: Any) -> Any:
    """`call(*args)` (one member's code) for every member, `members_swaps`' stand-ins in place of its layers."""
    with swapped(swaps):
        return call(*args)


@contextlib.contextmanager
def swapped(swaps: list[Swap]) -> Iterator[None]:
    """Within it, the member's module computes for every member (`members_swaps`' stand-ins in place of its layers)."""
    for parent, name, _, members in swaps:
        parent._modules[name] = members
    try:
        yield
    finally:
        for parent, name, own, _ in swaps:
            parent._modules[name] = own


def members_swaps(module: nn.Module, params: dict[str, torch.Tensor]) -> list[Swap] | None:
    """(parent, child name, the member's module, its every-member stand-in) for each linear layer, layer norm and
    flatten of `module`; None when a weight or buffer sits anywhere else (a Gaussian head's log std, a convolution,
    ...)."""
    swaps: list[Swap] = []
    covered: set[str] = set()
    for parent_name, parent in module.named_modules():
        for name, child in parent.named_children():
            path = f"{parent_name}.{name}" if parent_name else name
            if isinstance(child, nn.Linear):
                if f"{path}.weight" not in params:  # one layer under two names: left to vmap
                    return None
                bias = params.get(f"{path}.bias") if child.bias is not None else None
                swaps.append((parent, name, child, _MembersLinear(params[f"{path}.weight"], bias)))
                covered.update(f"{path}.{p}" for p, _ in child.named_parameters())
            elif isinstance(child, nn.LayerNorm):
                names = [f"{path}.{p}" for p, _ in child.named_parameters()]
                if any(name not in params for name in names):
                    return None
                weight = params.get(f"{path}.weight") if child.weight is not None else None
                bias = params.get(f"{path}.bias") if child.bias is not None else None
                swaps.append((parent, name, child, _MembersLayerNorm(child, weight, bias)))
                covered.update(names)
            elif isinstance(child, nn.Flatten) and child.start_dim >= 0 and child.end_dim == -1:
                swaps.append((parent, name, child, nn.Flatten(child.start_dim + 1)))
    if covered != set(params):
        return None
    if any(not isinstance(owner, RunningNorm) for owner in module.modules() if list(owner.buffers(recurse=False))):
        return None
    return swaps


def same(a: Any, b: Any) -> bool:
    """The same tensors, bit for bit, in the same structure (tuples, lists, dicts; None for None)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, tuple | list):
        return isinstance(b, tuple | list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a is None and b is None


def same_losses(fast: tuple[torch.Tensor, Any], slow: tuple[torch.Tensor, Any], inputs: Sequence[torch.Tensor]) -> bool:
    """The same (losses, logs) bit for bit, and the same gradients of the losses' sum with respect to `inputs` (the
    graph is kept: the step's backward runs afterwards)."""
    if not same(fast, slow):
        return False
    inputs = [t for t in inputs if t.requires_grad]
    if not inputs or not fast[0].requires_grad:
        return True
    return same(*(torch.autograd.grad(out[0].sum(), inputs, retain_graph=True, allow_unused=True)
                  for out in (fast, slow)))


class MembersActing:
    """An on-policy population's acting: `policy_and_values` for all members' observations at once, each member's
    acting draw from its own stream (`acting_noise`), and where the members' heads draw apart (a categorical head's
    uniforms) their actions in one `act_on` call over their stacked rows (`act_members`, `act_deterministically`):
    elementwise, so each member's actions are its own `act_on`'s, bit for bit. Elsewhere (a Gaussian's, gSDE's, PQN's
    epsilon-greedy) each member acts on its rows with its own `act_on`."""

    def __init__(self, algos: Sequence[Any], params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor]) -> None:
        self.algos = list(algos)
        networks = self.algos[0].networks
        member_act = NetworksCall(networks, networks.policy_and_values)  # the policy head's parameters, the values
        self._vmapped_act, self._weights = vmapped(member_act), (params, buffers)
        swaps = members_swaps(member_act.networks, params)
        self._act = CheckedFastPath(None if swaps is None else partial(call_swapped, swaps, member_act))
        self.draws_apart = all(_takes_uniforms(a) for a in self.algos)

    @torch.inference_mode()
    def policy_and_values(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[members, envs, ...] observations -> each member's policy-head parameters and values, one call."""
        out: tuple[torch.Tensor, torch.Tensor] = self._act(partial(self._vmapped_act, *self._weights, obs), same, obs)
        return out

    def acting_noise(self, member: int, outputs: torch.Tensor) -> torch.Tensor | None:
        """The member's acting draw for its rows of the batched outputs, from torch's global generator (the caller
        swaps the member's stream in): the uniforms its single run's `act_on` draws there. None where the member acts
        alone (`act_on`)."""
        if not self.draws_apart:
            return None
        draw: torch.Tensor | None = self.algos[member].networks.draw(outputs)
        return draw

    @torch.inference_mode()
    def act_members(self, outputs: torch.Tensor, draws: dict[int, torch.Tensor],
                    values: torch.Tensor | None = None) -> dict[int, ActOutput]:
        """The actions of the members in `draws`, in one `act_on` call over their stacked rows."""
        assert values is not None
        members = list(draws)
        rows = outputs if len(members) == outputs.shape[0] else outputs[members]
        value_rows = values if len(members) == values.shape[0] else values[members]
        out = self.algos[members[0]].act_on(rows, value_rows, uniforms=torch.stack([draws[m] for m in members]))
        return {m: ActOutput(out.actions[k], out.log_probs[k], out.values[k]) for k, m in enumerate(members)}

    @torch.inference_mode()
    def act_deterministically(self, outputs: torch.Tensor, values: torch.Tensor,
                              members: list[int]) -> dict[int, ActOutput] | None:
        """The deterministic actions of `members` (a test phase's) in one `act_on` call where the heads are
        categorical (an argmax per row); None for the others, which act member by member."""
        if not self.draws_apart:
            return None
        rows = outputs if len(members) == outputs.shape[0] else outputs[members]
        value_rows = values if len(members) == values.shape[0] else values[members]
        out = self.algos[members[0]].act_on(rows, value_rows, deterministic=True)
        return {m: ActOutput(out.actions[k], out.log_probs[k], out.values[k]) for k, m in enumerate(members)}


def _takes_uniforms(algo: Any) -> bool:
    """Whether the algorithm's `act_on` acts on a draw taken beforehand (PPO's, A2C's, PG's) and its policy head
    draws apart (`networks.draw`: a categorical head)."""
    networks = algo.networks
    return ("uniforms" in inspect.signature(type(algo).act_on).parameters and callable(getattr(networks, "draw", None))
            and callable(getattr(getattr(networks, "head", None), "draw", None)))
