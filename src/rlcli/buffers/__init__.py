"""Buffers register themselves on import."""

from rlcli.buffers import rollout  # noqa: F401
