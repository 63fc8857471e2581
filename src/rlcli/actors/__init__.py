"""Actors register themselves on import."""

from rlcli.actors import cnn, combined, mlp, recurrent  # noqa: F401
