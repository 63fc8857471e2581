"""How an algorithm's gradient step reaches its networks, its optimizers and the run's random stream.

An algorithm written this way has one step, `_gradient_step(batch, run)`, and does everything that touches a
network's weights, an optimizer or a random draw through `run`:

    run(step, *args)            the LossStep's gradient step: (loss, aux), as `step(*args)`
    run.draw(lambda: ...)       random numbers drawn from the run's stream (a tensor, or lists and tuples of them)
    run.read(self.method, *xs)  a value of the algorithm (a method of it, given its rows of `xs`), outside any
                                gradient (SAC's alpha; PPO's settings and the update's metrics)
    run.only(lambda algo, *xs: ...,  *xs)
                                the runner of the members for which it holds (given their rows of `xs`), or None
                                (SAC: whose temperature learns; PPO: who goes on after an epoch, algo.target_kl)
    run.take(batch, idx)        the batch's rows at `idx` (a minibatch)
    run.tally(tally, stats)     a step's metrics added to the update's sums (`means(tally)`: their means)
    run.polyak(target, source)  the target network toward its source at the algorithm's `tau`
    run.mean(x)                 a metric's mean over the batch
    run.storage                 the storage the batch came from (ReBRAC reads the data's next actions)

and may end each update phase with `finish_update(clock, metrics)` (DQN: its target network at an interval of env
steps; PPO-KL: its penalty's adaptation), which a population calls on each member after its phase.

An off-policy algorithm's step is `_gradient_step(batch, run)`, called once per gradient step on a sampled batch
(`single_run_update`); an on-policy one's is `_update(batch, run)`, its whole update on the rollout
(`single_rollout_update`: epochs of minibatches, or one step on it all).

A single run's `SingleRun` does each as written. A population (sweeps/population/lockstep.py) runs the same step once
for all its members: the batch, the draws and every tensor a step returns carry a leading members axis, each LossStep's
loss is vectorized over the members' stacked weights (`vmap`) and each member's own optimizer steps its row. So the
step itself does no arithmetic on tensors (a mean over a stacked batch would mix the members): what it computes is
in a loss, or `run.mean`; the sizes it draws take the batch's from `batch_rows`. Counters it keeps
(`gradient_updates`) go on as plain Python: the population's members step in lockstep.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, TypeVar

import torch
from torch import nn

from rlcli.algos.loss_step import LossStep
from rlcli.algos.offpolicy import StepOutput, gradient_steps_now, polyak_update, run_gradient_steps
from rlcli.batches import RolloutBatch
from rlcli.contracts import ReplayStorage, RolloutStorage, RunClock

T = TypeVar("T")


def batch_rows(batch: Any) -> int:
    """The transitions in a batch (the last axis of its rewards, or a rollout's mask: a population's batch has
    members first)."""
    return int((batch.mask if isinstance(batch, RolloutBatch) else batch.rewards).shape[-1])


class Tally(NamedTuple):
    """An update's metrics summed over its steps, and the steps counted (each member's own, in a population)."""

    sums: dict[str, torch.Tensor]
    count: Any  # int, or a population's [members] tensor


def means(tally: Tally | None) -> dict[str, torch.Tensor]:
    """The means of the tallied metrics over the steps taken."""
    return {} if tally is None else {k: v / tally.count for k, v in tally.sums.items()}


class Runner(Protocol):
    """What an algorithm's `_gradient_step(batch, run)` may do with its runner (this module's docstring)."""

    storage: Any

    def __call__(self, step: LossStep, *args: Any) -> tuple[torch.Tensor, Any]: ...

    def draw(self, draw: Callable[[], T]) -> T: ...

    def read(self, read: Callable[..., T], *rows: Any) -> T: ...

    def only(self, members: Callable[..., bool], *rows: Any) -> Runner | None: ...

    def take(self, batch: Any, idx: Any) -> Any: ...

    def tally(self, tally: Tally | None, stats: dict[str, torch.Tensor]) -> Tally: ...

    def polyak(self, target: nn.Module, source: nn.Module) -> None: ...

    def mean(self, x: torch.Tensor) -> torch.Tensor: ...


class SingleRun:
    """One run's way: each call as it reads."""

    def __init__(self, algo: Any, storage: Any) -> None:
        self.algo, self.storage = algo, storage

    def __call__(self, step: LossStep, *args: Any) -> tuple[torch.Tensor, Any]:
        return step(*args)

    def draw(self, draw: Callable[[], T]) -> T:
        return draw()

    def read(self, read: Callable[..., T], *rows: Any) -> T:
        read_owner(read, self.algo)  # what a population can read per member, checked in single runs too
        return read(*rows)

    def only(self, members: Callable[..., bool], *rows: Any) -> SingleRun | None:
        return self if members(self.algo, *rows) else None

    def take(self, batch: Any, idx: Any) -> Any:
        return type(batch)(*(None if x is None else x[idx] for x in batch))

    def tally(self, tally: Tally | None, stats: dict[str, torch.Tensor]) -> Tally:
        sums = {} if tally is None else tally.sums
        return Tally({k: sums.get(k, 0.0) + v for k, v in stats.items()}, 1 if tally is None else tally.count + 1)

    def polyak(self, target: nn.Module, source: nn.Module) -> None:
        polyak_update(target, source, self.algo.tau)

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean()


def single_run_update(algo: Any, storage: ReplayStorage, clock: RunClock) -> dict[str, torch.Tensor]:
    """An update phase of an algorithm written for a runner: its gradient steps this phase, each on a batch from
    `storage`, through one `SingleRun` (nothing while the storage holds no whole transition yet)."""
    if len(storage) == 0:
        return {}
    run = SingleRun(algo, storage)
    step: Callable[[Any], StepOutput] = lambda batch: algo._gradient_step(batch, run)  # noqa: E731
    metrics = run_gradient_steps(storage, algo.batch_size, gradient_steps_now(algo.gradient_steps, clock), step)
    return finish_phase(algo, clock, metrics)


def single_rollout_update(algo: Any, buffer: RolloutStorage, clock: RunClock) -> dict[str, torch.Tensor]:
    """An on-policy algorithm's update written for a runner: its `_update` on the whole rollout through one
    `SingleRun`, then its `finish_update` where it has one."""
    return finish_phase(algo, clock, algo._update(buffer.flat(), SingleRun(algo, buffer)))


def finish_phase(algo: Any, clock: RunClock | None, metrics: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """After an update phase's gradient steps: the algorithm's `finish_update(clock, metrics)` where it has one (DQN's
    target network at an interval of env steps, and its phase metrics), each member's own in a population."""
    finish = getattr(algo, "finish_update", None)
    return metrics if finish is None else finish(clock, metrics)


def read_owner(read: Callable[[], Any], algo: Any) -> str | None:
    """`run.read`'s argument is a method of the algorithm (None) or of an object it holds (that attribute's name), so
    that a population can call each member's own; anything else is a TypeError naming what it takes."""
    owner = getattr(read, "__self__", None)
    if owner is algo and hasattr(read, "__func__"):
        return None
    held: list[str] = [name for name, value in vars(algo).items() if value is owner] if owner is not None else []
    if not held or not hasattr(read, "__func__"):
        raise TypeError(f"run.read({getattr(read, '__qualname__', read)!r}) takes a method of the algorithm or of an "
                        "object it holds (self.alpha, self.temperature.target)")
    return held[0]
