"""A loss of all members without vmap: the algorithm's own loss called once on the stacked [members, batch, ...]
tensors (the networks' layers swapped for batched stand-ins: acting.py), its means taken per member
(algos/base.members_first).

Why: vmap's own work per operation made PPO's loss (~40 small operations) cost 0.65-0.9 ms per minibatch step with
their backward, for 4 members, against 0.34 ms written over the members' axis. The first call checks that the
two agree bit for bit (the losses, what they log, and their gradients with respect to `evaluated`: the networks'
outputs, or the stacked weights); if they do not, every call goes through vmap.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlcli.algos.base import members_first

LossCall = Callable[[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], dict[str, torch.Tensor]],
                    tuple[torch.Tensor, dict[str, torch.Tensor]]]


class MembersLoss:
    """`(batch, evaluated, terms) -> ([members] losses, {name: [members]})` for all members: `loss` (one member's
    loss, its networks' outputs given) called on the members' stacked rows, or vmap of it (`vmapped_loss`)."""

    def __init__(self, loss: LossCall, vmapped_loss: LossCall) -> None:
        self.loss, self.vmapped_loss = loss, vmapped_loss
        self.direct: bool | None = None  # None: not yet checked against vmap

    def __call__(self, batch: tuple[torch.Tensor, ...], evaluated: tuple[torch.Tensor, ...],
                 terms: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if self.direct is False:
            return self.vmapped_loss(batch, evaluated, terms)
        if self.direct is None:
            try:
                fast = self._direct(batch, evaluated, terms)
            except (RuntimeError, IndexError, ValueError):  # a loss written for one member's shapes only: vmap's
                fast = None  # (a real fault in the loss shows again under vmap, just below)
            slow = self.vmapped_loss(batch, evaluated, terms)
            self.direct = fast is not None and _same(fast, slow, evaluated)
            return fast if self.direct and fast is not None else slow
        fast = self._direct(batch, evaluated, terms)
        if fast is None:  # a loss that no longer reduces per member (its shapes changed): vmap from here on
            self.direct = False
            return self.vmapped_loss(batch, evaluated, terms)
        return fast

    def _direct(self, batch: tuple[torch.Tensor, ...], evaluated: tuple[torch.Tensor, ...],
                terms: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]] | None:
        """The loss over the members' axis; None where it does not give one [members, 1] value per member (a loss
        that reduces some other way), which the first call's check then rejects."""
        members = evaluated[0].shape[0]
        with members_first():
            losses, stats = self.loss(batch, evaluated, {k: v.unsqueeze(-1) for k, v in terms.items()})
        values = [losses, *stats.values()]
        if any(not isinstance(v, torch.Tensor) or v.shape != (members, 1) for v in values):
            return None
        return losses.squeeze(-1), {k: v.squeeze(-1) for k, v in stats.items()}


def _same(fast: tuple[torch.Tensor, dict[str, torch.Tensor]], slow: tuple[torch.Tensor, dict[str, torch.Tensor]],
          evaluated: tuple[torch.Tensor, ...]) -> bool:
    """The same losses and logs, bit for bit, and the same gradients of the losses' sum with respect to the
    networks' outputs (the graph is kept: the step's backward runs afterwards)."""
    (fast_loss, fast_stats), (slow_loss, slow_stats) = fast, slow
    if fast_stats.keys() != slow_stats.keys():
        return False
    pairs = [(fast_loss, slow_loss), *((fast_stats[k], slow_stats[k]) for k in fast_stats)]
    if any(a.shape != b.shape or not torch.equal(a, b) for a, b in pairs):
        return False
    inputs = [t for t in evaluated if t.requires_grad]
    if not inputs or not fast_loss.requires_grad:
        return True
    fast_grads = torch.autograd.grad(fast_loss.sum(), inputs, retain_graph=True, allow_unused=True)
    slow_grads = torch.autograd.grad(slow_loss.sum(), inputs, retain_graph=True, allow_unused=True)
    return all(_equal_or_none(a, b) for a, b in zip(fast_grads, slow_grads, strict=True))


def _equal_or_none(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and torch.equal(a, b)

