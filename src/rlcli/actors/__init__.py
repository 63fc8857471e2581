"""Actors register themselves on import."""

from rlcli.actors import mlp, recurrent  # noqa: F401
