"""Buffers register themselves on import."""

from rlcli.buffers import prioritized, replay, rollout  # noqa: F401
