"""Cross-play of a competitive run's groups: each group played by the trained policy or uniformly at random.

A competitive run's own returns move as both sides learn (an arms race), so they do not say whether each side
learned. Playing each side's trained policy against a random opponent does:

    python scripts/multiagent_crossplay.py <run dir> [episodes]

For a run of env.groups (env=simple_tag_v3: adversary, agent) it prints each group's mean return (the sum of its
agents') for every pairing of trained and random groups, over the same seeded episodes.
"""

from __future__ import annotations

import itertools
import sys

import numpy as np

import rlcli
from rlcli.envs.multiagent import find_attr, resolve_parallel_env


def main(run_dir: str, episodes: int = 100) -> None:
    policy = rlcli.load(run_dir)
    env_cfg = policy.config.env
    probe = policy.make_env()
    groups: dict[str, list[str]] = find_attr(probe, "agent_groups") or {}
    probe.close()
    if len(groups) < 2:
        sys.exit(f"{run_dir}: a run of env.groups with two or more groups is needed (this one has {len(groups)})")
    env = resolve_parallel_env(str(env_cfg.id))(**dict(env_cfg.kwargs))
    rng = np.random.default_rng(0)
    print(f"{run_dir}: {episodes} episodes per pairing (seeds 0..{episodes - 1}); trained policies act "
          "deterministically")
    for trained in itertools.product([True, False], repeat=len(groups)):
        by_agent = {name: t for t, names in zip(trained, groups.values(), strict=True) for name in names}
        totals = {group: [] for group in groups}
        for seed in range(episodes):
            obs, _ = env.reset(seed=seed)
            returns = dict.fromkeys(env.possible_agents, 0.0)
            while env.agents:
                learned, _ = policy.predict({a: obs[a] for a in env.agents if by_agent.get(a)}, deterministic=True)
                actions = {a: learned[a] if by_agent.get(a) else int(rng.integers(env.action_space(a).n))
                           for a in env.agents}
                obs, rewards, *_ = env.step(actions)
                for a, r in rewards.items():
                    returns[a] += r
            for group, names in groups.items():
                totals[group].append(sum(returns[a] for a in names))
        label = ", ".join(f"{group} {'trained' if t else 'random'}" for group, t in zip(groups, trained, strict=True))
        means = ", ".join(f"{group} {np.mean(r):.1f}" for group, r in totals.items())
        print(f"  {label:40s} -> {means}")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) == 3 else 100)
