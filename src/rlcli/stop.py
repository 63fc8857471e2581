"""The one exception that a stop signal turns into while training; its own module so that the console entry
points (which must import nothing heavy) and the trainer both take it from here."""

from __future__ import annotations


class StopNow(KeyboardInterrupt):
    """A second Ctrl-C / SIGTERM while training: stop at once, without the checkpoint of the first."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
