"""The population's loop: each member collects, then one batched update for all, then the due members' test
episodes together, then each member's own logs, stop and checkpoint steps: the single run's loop (trainer.py) with
its update and its tests' acting shared."""

from __future__ import annotations

import time

from rlcli.collectors.env_faults import CollectorError
from rlcli.collectors.local import CollectStats
from rlcli.collectors.testing import TestStats
from rlcli.run.divergence import Diverged
from rlcli.run.stop import RunFailed, StoppedBySignal, StopSignals
from rlcli.services.deadlines import DEADLINES
from rlcli.sweeps.population import streams
from rlcli.sweeps.population.collect import collect_together
from rlcli.sweeps.population.lockstep import Population
from rlcli.sweeps.population.members import Member
from rlcli.sweeps.population.testing import test_together


def train_population(members: list[Member], population: Population) -> int | None:
    """Train every member to its end; returns the signal that stopped the population (None: none did)."""
    signals = StopSignals()  # the population's: a member's own stays quiet until the whole iteration is done
    for member in members:
        with member.turn():
            _start(member)
    restore = signals.catch()
    # train.step_timeout (part of the population key, so every member's): a hung env step fails its member in one line
    restore_deadlines = DEADLINES.install(members[0].trainer.c.settings.step_timeout)
    try:
        while any(m.live for m in members):
            waiting = _WaitingAccount([m for m in members if m.live])
            for member in [m for m in members if m.live]:
                # True while an off-policy member warms up. No turn: it draws and logs nothing, and swapping a
                # member's RNG states in and out costs ~85 us (numpy's most of it)
                member.warming_up = member.trainer.warming_up()
            for member, collected in zip(members, collect_together(members, population), strict=True):
                if member.live:
                    with member.turn():
                        _after_collect(member, collected)
            _update(members, population)
            going = []  # the members whose iteration goes on (not rolled back, failed or stopped)
            for member in [m for m in members if m.live]:
                with member.turn():
                    if _record_update(member):
                        going.append(member)
            due = [m in going and m.it is not None and m.trainer.test_due(m.it) for m in members]
            tested = test_together(members, due, population)
            for index, member in enumerate(members):
                if member in going:
                    with member.turn():
                        _after_update(member, tested.get(index))
            waiting.credit()
            if signals.received is not None:  # Ctrl-C / SIGTERM: every live member saved at this same step
                for member in [m for m in members if m.live]:
                    with member.turn():
                        _stop(member, signals.received)
    finally:
        restore_deadlines()
        restore()
    return signals.received


class _WaitingAccount:
    """A member's time account counts its own phases; the rest of an iteration's wall time is mostly the other
    members' turns (their envs, tests, logs), which would swell its `other`. Each member is credited that time
    as `others`, leaving in `other` its share of what no member's phases account for (the loop's own glue)."""

    def __init__(self, members: list[Member]) -> None:
        self.members, self.started = members, time.perf_counter()
        self.before = [self._own(m) for m in members]

    @staticmethod
    def _own(member: Member) -> float:
        return sum(v for k, v in member.trainer.c.clock.seconds.items() if k != "others")

    def credit(self) -> None:
        wall = time.perf_counter() - self.started
        own = [self._own(m) - before for m, before in zip(self.members, self.before, strict=True)]
        glue = max(0.0, wall - sum(own)) / len(self.members)
        for member, mine in zip(self.members, own, strict=True):
            seconds = member.trainer.c.clock.seconds
            seconds["others"] = seconds.get("others", 0.0) + max(0.0, wall - mine - glue)


def _start(member: Member) -> None:
    trainer = member.trainer
    if trainer.already_done():
        trainer.say_already_done()
        member.end()
        return
    trainer.start()


def _after_collect(member: Member, collected: CollectStats | CollectorError | None) -> None:
    if isinstance(collected, CollectorError):
        _fail(member, collected)
        return
    assert collected is not None
    member.it = member.trainer.after_collect(collected)
    member.planned = member.trainer.before_update(member.it)


def _update(members: list[Member], population: Population) -> None:
    active = [m.live and m.planned is not None for m in members]  # an off-policy member learns once it has warmed up
    rngs = [streams.of_member(m.rng) for m in members]
    clocks = [m.planned.clock if m.planned is not None else None for m in members]
    started = time.perf_counter()
    metrics = population.update(active, [m.trainer.c.buffer for m in members], rngs, clocks)
    share = (time.perf_counter() - started) / max(1, sum(active))
    for member, rng, result in zip(members, rngs, metrics, strict=True):
        if member.live:
            streams.keep(member.rng, rng)
            member.trainer.c.clock.seconds["update"] += share
            member.metrics = result


def _record_update(member: Member) -> bool:
    """The member's update checked and counted; False: it rolled back to its last good checkpoint (it collects again
    from there) or ended."""
    trainer, it = member.trainer, member.it
    assert it is not None
    try:
        return trainer.record_update(it, member.planned, member.metrics)
    except (CollectorError, Diverged) as error:
        _fail(member, error)
    except RunFailed as failed:
        member.end(failed)
    return False


def _after_update(member: Member, tested: TestStats | CollectorError | None) -> None:
    """Its test (`tested`: the episodes it ran with the others, or the error of a test env that failed), logs, stop
    and checkpoint steps."""
    trainer, it = member.trainer, member.it
    assert it is not None
    if isinstance(tested, CollectorError):
        _fail(member, tested)
        return
    try:
        total = trainer.c.settings.total_steps
        if trainer.after_update(it, tested) or trainer.state.env_steps >= total:
            trainer.finish()
            member.end()
    except (CollectorError, Diverged) as error:
        _fail(member, error)
    except RunFailed as failed:
        member.end(failed)


def _stop(member: Member, signum: int) -> None:
    member.trainer.signals.received = signum
    try:
        member.trainer.stop_on_signal()  # a checkpoint, one line, then StoppedBySignal
    except StoppedBySignal as stopped:
        member.end(stopped)


def _fail(member: Member, error: CollectorError | Diverged) -> None:
    """A failing env or a diverged member ends that member only (one line, as a single run says it)."""
    try:
        member.trainer.fail_run(member.trainer.describe_failure(error))
    except RunFailed as failed:
        member.end(failed)
