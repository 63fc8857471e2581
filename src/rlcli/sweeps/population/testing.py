"""A population's test phases: the members whose test is due this iteration run their test episodes in step, the
acting's forward done for all members in one call, then the members' deterministic actions: in one call where their
heads allow it (categorical: an argmax per row), else each member's from its own rows. A deterministic test draws
nothing, so no member's stream is touched.

Why: a test phase is episodes of the deterministic policy, one forward per step, run by each member in turn: a
tenth of a PPO CartPole member's time in a population (8 test envs, most of it the forward). A member whose tests
need more than observations (action masks, a recurrent carry) tests alone, in its own `after_update`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from rlcli.collectors.env_faults import CollectorError
from rlcli.collectors.testing import TestEpisodes, TestStats
from rlcli.run.evaluation import test_seed
from rlcli.sweeps.population.collect import on_host
from rlcli.sweeps.population.lockstep import Population
from rlcli.sweeps.population.members import Member


def test_together(members: Sequence[Member], due: Sequence[bool], population: Population,
                  ) -> dict[int, TestStats | CollectorError]:
    """The test episodes of each member that is `due` a test phase and can take one together, by member index (the
    others run theirs alone), or the error of a member whose test env failed (a step past train.step_timeout),
    which then stops while the others go on. Each member's share of the wall time goes to its time account's
    `test`."""
    runs: dict[int, TestEpisodes] = {}
    for index, (member, on) in enumerate(zip(members, due, strict=True)):
        c = member.trainer.c
        if on and not c.spec.action_masks and not c.carry_size:
            runs[index] = TestEpisodes(c.test_envs, test_seed(c, member.trainer.state))
    if not runs:
        return {}
    started = time.perf_counter()
    failed: dict[int, CollectorError] = {}
    acting = population.acting  # on-policy members' forward in one call (None: each member's own act)
    while stepping := {index: run for index, run in runs.items() if not run.done}:
        with torch.inference_mode():
            seen = {}
            for index, run in stepping.items():
                c = members[index].trainer.c
                seen[index] = c.algo.networks.normalizer(torch.as_tensor(run.obs, dtype=c.obs_dtype, device=c.device))
            first = next(iter(seen.values()))
            obs = torch.stack([seen.get(index, torch.zeros_like(first)) for index in range(len(members))])
            if acting is not None:
                params, values = acting.policy_and_values(obs)
                together = acting.act_deterministically(params, values, list(stepping))
            actions = {}
            for index in stepping:
                algo = members[index].trainer.c.algo
                if acting is None:
                    out = algo.act(obs[index], deterministic=True)
                elif together is not None:
                    out = together[index]
                else:
                    out = algo.act_on(params[index], values[index], deterministic=True)  # type: ignore[attr-defined]
                actions[index] = algo.env_actions(out.actions)
        for index, env_actions in on_host(actions).items():  # from a GPU in one copy
            try:
                stepping[index].step(env_actions)
            except CollectorError as error:
                failed[index] = error
                del runs[index]
    share = (time.perf_counter() - started) / max(1, len(runs))
    for index in runs:
        members[index].trainer.c.clock.seconds["test"] += share
    return {**failed, **{index: run.stats() for index, run in runs.items()}}
