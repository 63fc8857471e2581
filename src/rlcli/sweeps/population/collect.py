"""A population's collect phase: every live member's envs stepped in step with the others, the acting's
arithmetic done for all members in one call, and each member's actions drawn from its own torch RNG stream
(the same draws its single run makes), then each member's envs stepped and its storage filled by its own
collector (collectors/local.py's `observe` / `advance` / `end`)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import cast

import torch

from rlcli.collectors.env_faults import CollectorError
from rlcli.collectors.local import Collector, CollectStats
from rlcli.sweeps.population import streams
from rlcli.sweeps.population.kinds import Population
from rlcli.sweeps.population.members import Member


def collect_together(members: Sequence[Member], population: Population,
                     ) -> list[CollectStats | CollectorError | None]:
    """One collect phase of each live member (None for the others; the error for a member whose env failed,
    which then stops stepping while the others go on)."""
    rows = [m for m in members if m.live]
    failed: dict[int, CollectorError] = {}
    # the local collector, which the launcher checked (collector=ray's workers step their envs themselves)
    collectors = {id(m): cast(Collector, m.trainer.c.collector) for m in rows}
    stats = {id(m): collectors[id(m)].begin(m.trainer.c.learner) for m in rows}
    for step in itertools.count():
        # each member's phase ends where its single run's ends (algo.train_freq_unit=episode: at different steps,
        # and a member that is through stops stepping while the others go on)
        for member in [m for m in rows if collectors[id(m)].collected_enough(m.trainer.c.learner, stats[id(m)], step)]:
            rows.remove(member)
            collectors[id(member)].end(member.trainer.c.learner)
        if not rows:
            break
        started = time.perf_counter()
        seen = {id(m): collectors[id(m)].observe() for m in rows}  # the others' rows (failed, through) stay zeros
        first = next(iter(seen.values()))[0]
        obs = torch.stack([seen[id(m)][0] if id(m) in seen else torch.zeros_like(first) for m in members])
        params, values = population.policy_and_values(obs)
        share = (time.perf_counter() - started) / len(rows)
        for index, member in enumerate(members):
            if id(member) not in seen or id(member) in failed:
                continue
            algo, collector = member.trainer.c.algo, collectors[id(member)]
            drawn = time.perf_counter()
            # its acting's draws (and an off-policy warm-up's random actions), from its own stream
            stream = streams.of_member(member.rng)
            streams.use(stream)
            out = None
            if not member.warming_up:
                with torch.inference_mode():
                    out = algo.act_on(params[index], values[index])  # type: ignore[attr-defined]
            collector.act_s += share + time.perf_counter() - drawn
            try:
                collector.advance(member.trainer.c.learner, stats[id(member)], step, seen[id(member)][0], None, out,
                                  random_actions=member.warming_up)
            except CollectorError as error:
                failed[id(member)] = error
            streams.keep(member.rng, streams.current(stream))
        rows = [m for m in rows if id(m) not in failed]
    return [failed.get(id(m), stats.get(id(m))) for m in members]

