"""Buffers register themselves on import."""

from rlcli.buffers import her, prioritized, replay, rollout  # noqa: F401
