"""Actors register themselves on import."""

from rlcli.actors import cnn, mlp, recurrent  # noqa: F401
