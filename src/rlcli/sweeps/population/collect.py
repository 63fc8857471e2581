"""A population's collect phase: every live member's envs stepped in step with the others, the acting's
arithmetic done for all members in one call, and each member's actions drawn from its own torch RNG stream
(the same draws its single run makes), all members' env actions moved to the host at once, then each member's envs
stepped and its storage filled by its own collector (collectors/local.py's `observe` / `advance` / `end`)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch

from rlcli.collectors.env_faults import CollectorError
from rlcli.collectors.local import Collector, CollectStats
from rlcli.collectors.offline import OfflineCollector
from rlcli.contracts import ActOutput
from rlcli.sweeps.population import streams
from rlcli.sweeps.population.lockstep import Population
from rlcli.sweeps.population.members import Member


def collect_together(members: Sequence[Member], population: Population,
                     ) -> list[CollectStats | CollectorError | None]:
    """One collect phase of each live member (None for the others; the error for a member whose env failed,
    which then stops stepping while the others go on)."""
    live = [m for m in members if m.live]
    failed: dict[int, CollectorError] = {}
    # an offline member's collector steps no env: its phase is its single run's (a count of gradient steps)
    stats = {id(m): m.trainer.c.collector.collect(m.trainer.c.learner) for m in live
             if isinstance(m.trainer.c.collector, OfflineCollector)}
    rows = [m for m in live if id(m) not in stats]
    # the local collector, which the launcher checked (collector=ray's workers step their envs themselves)
    collectors = {id(m): cast(Collector, m.trainer.c.collector) for m in rows}
    stats |= {id(m): collectors[id(m)].begin(m.trainer.c.learner) for m in rows}
    batched = population.acting  # on-policy members' forward in one call (None: each member's own act)
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
        params, values = batched.policy_and_values(obs) if batched is not None else (obs, None)
        share = (time.perf_counter() - started) / len(rows)
        acting = [(index, member) for index, member in enumerate(members) if id(member) in seen]
        outs: dict[int, ActOutput | None] = {}
        actions: dict[int, torch.Tensor] = {}
        draws: dict[int, Any] = {}  # members whose draws are acted on in one call, after this loop
        for index, member in acting:
            algo, collector = member.trainer.c.algo, collectors[id(member)]
            drawn = time.perf_counter()
            # its acting's draws (and an off-policy warm-up's random actions), from its own stream
            stream = streams.of_member(member.rng)
            streams.use(stream)
            out = None
            if member.warming_up:
                actions[index] = collector.actions_to_take(member.trainer.c.learner, None, True)
            elif collector.action_mask is not None:  # among its valid actions: its own act_masked, as its single run
                with torch.inference_mode():
                    out = algo.act_masked(seen[id(member)][0], collector.action_mask)  # type: ignore[attr-defined]
                actions[index] = out.actions
            elif batched is not None and (draw := batched.acting_noise(index, params[index])) is not None:
                draws[index] = draw  # acted on with the others' after this loop
            else:  # on its own: the on-policy head's act_on, or an off-policy member's act on its observations
                with torch.inference_mode():
                    out = (algo.act(params[index]) if values is None else
                           algo.act_on(params[index], values[index]))  # type: ignore[attr-defined]
                actions[index] = out.actions
            outs[index] = out
            streams.keep(member.rng, streams.current(stream))
            collector.act_s += share + time.perf_counter() - drawn
        moved = time.perf_counter()
        if draws:
            assert batched is not None and values is not None
            for index, out in batched.act_members(params, draws, values).items():
                outs[index], actions[index] = out, out.actions
        env_actions = on_host({index: member.trainer.c.algo.env_actions(actions[index]) for index, member in acting})
        share = (time.perf_counter() - moved) / len(acting)
        for index, member in acting:
            collector = collectors[id(member)]
            collector.act_s += share
            try:  # the envs step and the storage fills outside the member's stream: neither draws from torch
                collector.advance(member.trainer.c.learner, stats[id(member)], step, seen[id(member)][0], None,
                                  outs[index], random_actions=member.warming_up,
                                  drawn=(actions[index], env_actions[index]))
            except CollectorError as error:
                failed[id(member)] = error
        rows = [m for m in rows if id(m) not in failed]
    return [failed.get(id(m), stats.get(id(m))) for m in members]


def on_host(actions: dict[int, torch.Tensor]) -> dict[int, np.ndarray]:
    """The members' env actions as numpy arrays; from a GPU in one copy (one wait for the device, not one per
    member)."""
    tensors = list(actions.values())
    if tensors[0].device.type == "cpu":
        return {index: tensor.numpy() for index, tensor in actions.items()}
    host = torch.cat(tensors).cpu().numpy()
    ends = np.cumsum([t.shape[0] for t in tensors])[:-1]
    return dict(zip(actions, np.split(host, ends), strict=True))
