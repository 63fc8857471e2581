"""Actors register themselves on import."""

from rlcli.actors import mlp  # noqa: F401
