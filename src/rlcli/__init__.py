"""rlcli: a config-driven reinforcement-learning training CLI (`rl-train algo=ppo env=CartPole-v1`)."""

__version__ = "0.1.0"
