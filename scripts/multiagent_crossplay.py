"""Cross-play of a competitive run's groups: each group played by the trained policy or uniformly at random.

A competitive run's own returns move as both sides learn (an arms race), so they do not say whether each side
learned. Playing each side's trained policy against a random opponent does:

    python scripts/multiagent_crossplay.py <run dir> [episodes] [best|last]

For a run of env.groups (env=simple_tag_v3: adversary, agent) it prints each group's mean return (the sum of its
agents') for every pairing of trained and random groups, over the same seeded episodes. It plays the run's last
checkpoint by default: best.pt is chosen by the team sum over every group, which in a competitive task favours
one side.
"""

from __future__ import annotations

import itertools
import sys
from typing import Any

import gymnasium as gym
import numpy as np

import rlcli
from rlcli.envs.multiagent import find_attr, resolve_parallel_env


def random_action(space: gym.spaces.Space, rng: np.random.Generator) -> Any:
    if isinstance(space, gym.spaces.Discrete):
        return int(space.start + rng.integers(space.n))
    if isinstance(space, gym.spaces.Box):
        return rng.uniform(space.low, space.high).astype(space.dtype)
    raise SystemExit(f"an agent acts in {space}: this script plays Discrete and Box actions at random")


def main(run_dir: str, episodes: int = 100, load: str = "last") -> None:
    policy = rlcli.load(run_dir, load=load)
    env_cfg = policy.config.env
    probe = policy.make_env()
    groups: dict[str, list[str]] = find_attr(probe, "agent_groups") or {}
    probe.close()
    if len(groups) < 2:
        sys.exit(f"{run_dir}: a run of env.groups with two or more groups is needed (this one has {len(groups)})")
    env = resolve_parallel_env(str(env_cfg.id))(**dict(env_cfg.kwargs))
    rng = np.random.default_rng(0)
    print(f"{run_dir} ({load}): {episodes} episodes per pairing (seeds 0..{episodes - 1}); trained policies act "
          "deterministically")
    for trained in itertools.product([True, False], repeat=len(groups)):
        by_agent = {name: t for t, names in zip(trained, groups.values(), strict=True) for name in names}
        totals = {group: [] for group in groups}
        for seed in range(episodes):
            obs, _ = env.reset(seed=seed)
            returns = dict.fromkeys(env.possible_agents, 0.0)
            while env.agents:
                learned, _ = policy.predict({a: obs[a] for a in env.agents if by_agent.get(a)}, deterministic=True)
                actions = {a: learned[a] if by_agent.get(a) else random_action(env.action_space(a), rng)
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
    if len(sys.argv) not in (2, 3, 4):
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) >= 3 else 100, sys.argv[3] if len(sys.argv) == 4 else "last")
