"""Algorithms register themselves on import; importing this package makes them all available."""

from rlcli.algos import a2c, crossq, dqn, maskable_ppo, pg, ppo, pqn, qrdqn, rnd, sac, td3, tqc, trpo  # noqa: F401
