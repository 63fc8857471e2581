"""The errors rlcli's Python API raises (entry/api.py), each also the built-in exception it stands for."""

from __future__ import annotations


class RlcliError(Exception):
    """Bad input (a config value, a path, a checkpoint) or a run that failed; the message is one line saying what is
    wrong and what would work, as rl-train and rl-eval print it."""


class InvalidValue(RlcliError, ValueError):
    """A value rlcli cannot use (a NaN observation, a section given as a number): an RlcliError and a ValueError, so
    either `except` catches it."""


class InvalidType(RlcliError, TypeError):
    """An argument of the wrong kind (a number for a path, a path for a Policy): an RlcliError and a TypeError."""


class NotFound(RlcliError, FileNotFoundError):
    """No run directory or checkpoint file at the path given: an RlcliError and a FileNotFoundError."""
