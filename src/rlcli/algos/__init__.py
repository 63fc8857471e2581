"""Algorithms register themselves on import; importing this package makes them all available."""

from rlcli.algos import a2c, dqn, pg, ppo, rnd, sac, td3  # noqa: F401
