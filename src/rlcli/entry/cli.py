"""Console entry points. They import nothing heavy before the signal handlers are in place, so that a
Ctrl-C or SIGTERM at any moment of start-up (imports, Hydra, building the run) ends in one line with
exit code 128 + the signal number, not a traceback."""

from __future__ import annotations

import os
import select
import signal
import sys
from typing import Any

from rlcli.run.stop import StopNow, note_start_up_signal, stopped_during_start_up, sweep_being_run


def print_version(program: str, args: list[str] | None = None) -> bool:
    """`--version` / `-V`: the program's and rlcli's version (Hydra's own flag would print Hydra's)."""
    if not any(a in ("--version", "-V") for a in (sys.argv[1:] if args is None else args)):
        return False
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("rlcli")
    except PackageNotFoundError:
        # a source checkout on PYTHONPATH: the package's own number (rlcli/__init__.py is loaded before any of
        # its modules, so this reads it without an import from this layer up to the package's face)
        installed = sys.modules["rlcli"].__version__
    print(f"{program} (rlcli) {installed}")
    return True


def stdout_was_closed() -> bool:
    """Whether the program reading stdout has exited (`rl-train --help | head`): the pipe reports an error."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (OSError, ValueError, AttributeError):  # no fileno (a notebook), or no poll on this platform
        return False


def quit_quietly_on_closed_stdout(error: BrokenPipeError) -> None:
    """As `yes | head` ends: nothing on stderr, the exit code of a SIGPIPE (141). Any other broken pipe (a worker's
    socket) is not ours to hide."""
    if not stdout_was_closed():
        raise error
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's last flush at exit does not fail again
    os.close(devnull)
    raise SystemExit(128 + signal.SIGPIPE) from None


def interrupt_on_signals() -> dict[str, int | None]:
    """SIGTERM and Ctrl-C raise KeyboardInterrupt where they land, and are noted (the returned dict's "signum"):
    where Python ignores that raise (a weakref callback inside an import, a `__del__`), the tool raises it again at
    its next safe place (run.stop.raise_lost_signal), and the ignored raise's report is kept off stderr."""
    received: dict[str, int | None] = {"signum": None}

    def on_signal(signum: int, frame: Any) -> None:
        received["signum"] = signum
        note_start_up_signal(signum)
        raise KeyboardInterrupt

    unraisable = sys.unraisablehook

    def quiet_lost_interrupt(lost: Any) -> None:
        if not (received["signum"] is not None and isinstance(lost.exc_value, KeyboardInterrupt)):
            unraisable(lost)

    sys.unraisablehook = quiet_lost_interrupt
    signal.signal(signal.SIGTERM, on_signal)
    # Ctrl-C works even when the tool was started with SIGINT ignored (a background job of a script)
    signal.signal(signal.SIGINT, on_signal)
    return received


def train() -> None:
    """`rl-train`."""
    if print_version("rl-train"):
        return
    received = interrupt_on_signals()
    try:
        from rlcli.entry.rl_train import main

        main()
    except StopNow as stop:
        print(stop.line(), file=sys.stderr)
        raise SystemExit(128 + stop.signum) from None
    except BrokenPipeError as error:
        quit_quietly_on_closed_stdout(error)
    except SystemExit:
        raise
    except BaseException as error:
        # A signal lands wherever start-up is: inside a library (OmegaConf, Hydra) the KeyboardInterrupt can come
        # out as that library's own error. The signal is what happened: say so in one line.
        if received["signum"] is None and not isinstance(error, KeyboardInterrupt):
            raise
        signum = received["signum"] or int(signal.SIGINT)
        print(stopped_during_start_up(signum, sweep_being_run(sys.argv[1:])), file=sys.stderr)
        raise SystemExit(128 + signum) from None


def evaluate() -> None:
    """`rl-eval`."""
    if print_version("rl-eval"):
        return

    received = interrupt_on_signals()
    try:
        from rlcli.entry.rl_eval import main

        main()
    except BrokenPipeError as error:
        quit_quietly_on_closed_stdout(error)
    except KeyboardInterrupt:
        written = getattr(sys.modules.get("rlcli.entry.rl_eval"), "written", [])
        signum = received["signum"] or int(signal.SIGINT)
        kept = f"kept what it had written: {', '.join(map(str, written))}" if written else "nothing was written"
        print(f"rl-eval: {signal.Signals(signum).name}: stopped; {kept}", file=sys.stderr)
        raise SystemExit(128 + signum) from None


def report() -> None:
    """`rl-report`."""
    if print_version("rl-report"):
        return
    from rlcli.entry.rl_report import main

    try:
        main()
    except BrokenPipeError as error:
        quit_quietly_on_closed_stdout(error)
