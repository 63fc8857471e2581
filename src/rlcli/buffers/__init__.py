"""Buffers register themselves on import."""

from rlcli.buffers import her, prioritized, replay, rollout, sequence  # noqa: F401
