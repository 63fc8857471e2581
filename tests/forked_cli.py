"""`rl-train` (and `rl-eval`, `rl-report`) runs for the tests, forked from a server process that imported torch,
gymnasium, Hydra and rlcli once.

Why: a fresh `rl-train` spends ~2 s of CPU importing before it reads its arguments, and the suite starts some
hundreds of them (each exact-resume case three); on CI's 2 cores that start-up was minutes of the wall time. A
forked run is still a process of its own: its own pid, arguments, working directory, environment, stdout and stderr
(files, so not a terminal, as with subprocess pipes), signal handlers and exit code (`-N` when a signal N killed
it); it enters at the console script's function (`rlcli.entry.cli:train`, `evaluate`, `report`) and ends as the
interpreter would (threads joined, atexit functions run, streams flushed).

A sweep (`-m`) forks too; its launcher's own worker processes (joblib's, the population launcher's fork server)
start as they would from rl-train. What stays a real subprocess: anything with Ray, and runs given an environment
that differs from the server's in anything but FORKABLE_ENV (a variable read at import would be missed);
`RLCLI_TESTS_REAL_PROCESSES=1` makes every run one (to check that both give the same results).

The tests' own process changes its environment as it goes (cv2's import sets LD_LIBRARY_PATH, Ray's
RAY_CLIENT_MODE, an in-process deterministic build CUBLAS_WORKSPACE_CONFIG, a compile TORCHINDUCTOR_CACHE_DIR): a
run given that environment then differs from the server's. Rather than start such runs fresh (all of a worker's
later runs, once one test had changed a variable: most of the suite's runs in CI), a new server is started from the
environment as it is now, where no run of the old one is still running (the old one ends after its last run).
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
RL_TRAIN = BIN / "rl-train"
ENTRIES = {"rl-train": "train", "rl-eval": "evaluate", "rl-report": "report"}  # rlcli.entry.cli's, as pyproject's
PRELOAD = ["torch", "gymnasium", "hydra", "omegaconf", "tensorboard.compat.proto.event_pb2", "rlcli.entry.cli",
           "rlcli.entry.rl_train", "rlcli.run.state", "rlcli.run.trainer"]
# variables the forked run may differ in from the server's environment: none is read when a module is imported, and
# PYTHONPATH's folders are put on sys.path as the interpreter would put them
FORKABLE_ENV = {"HYDRA_FULL_ERROR", "PYTEST_CURRENT_TEST", "PYTHONPATH"}

_server: dict[str, Any] = {}
_runs: weakref.WeakSet[ForkedRun] = weakref.WeakSet()  # the forked runs, to know whether one still runs
_old_servers: list[int] = []  # replaced servers (pids) not yet reaped


def _context() -> Any:
    """The forkserver context (started on first use, once per test process) and the environment it started with."""
    if not _server:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        _server.update(context=context, env=dict(os.environ))
    return _server["context"]


def _differs(env: dict[str, str], base: dict[str, str]) -> bool:
    return not {k for k in {*env, *base} if env.get(k) != base.get(k)} <= FORKABLE_ENV


def _restart_server() -> bool:
    """A new forkserver, started (on the next run) from this process's environment as it is now; False where a run
    of the current one still runs (its exit code comes through that server). The old server ends once its last
    child has (each holds the server's `alive` pipe)."""
    from multiprocessing import forkserver, util

    if any(run.poll() is None for run in list(_runs)):
        return False
    server = forkserver._forkserver  # type: ignore[attr-defined]
    with server._lock:
        if server._forkserver_pid is not None:
            os.close(server._forkserver_alive_fd)  # asks the old server to stop
            _old_servers.append(server._forkserver_pid)
            if not util.is_abstract_socket_namespace(server._forkserver_address):
                with contextlib.suppress(OSError):
                    os.unlink(server._forkserver_address)
            server._forkserver_alive_fd = server._forkserver_pid = server._forkserver_address = None
    for pid in list(_old_servers):  # reap the old servers that have ended
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == 0:
                continue
        _old_servers.remove(pid)
    _server["env"] = dict(os.environ)
    return True


def forkable(args: Sequence[str], env: dict[str, str]) -> bool:
    if os.environ.get("RLCLI_TESTS_REAL_PROCESSES") == "1" or sys.platform != "linux":
        return False
    if any("ray" in a for a in args):
        return False
    _context()
    if not _differs(env, _server["env"]):
        return True
    # this process's environment changed since the server started: a server started from it now, if that is the
    # run's environment (see the module docstring)
    return not _differs(env, dict(os.environ)) and _restart_server()


def _child(program: str, args: list[str], cwd: str, env: dict[str, str], out_path: str, err_path: str) -> None:
    """In the forked process: the program's console entry, with the process set up as a fresh one would be."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.path[1:1] = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    for fd, path in ((1, out_path), (2, err_path)):
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    # the handlers a new interpreter starts with (rl-train then sets its own)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    sys.argv = [str(BIN / program), *args]
    code = 0
    try:
        from rlcli.entry import cli

        getattr(cli, ENTRIES[program])()
    except SystemExit as stop:
        if isinstance(stop.code, int) or stop.code is None:
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  # the interpreter's exit: non-daemon threads joined,
    atexit._run_exitfuncs()  # then atexit's functions, then the streams flushed
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


class ForkedRun:
    """What the tests use of subprocess.Popen (poll, wait, communicate, send_signal, terminate, kill, returncode)."""

    def __init__(self, program: str, args: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.args = [str(BIN / program), *args]
        self._dir = tempfile.mkdtemp(prefix="rl-train-")
        self._out, self._err = os.path.join(self._dir, "stdout"), os.path.join(self._dir, "stderr")
        # the output files go with this object (or at the tests' exit), read or not
        weakref.finalize(self, shutil.rmtree, self._dir, True)
        self._output: tuple[str, str] | None = None
        self._process = _context().Process(target=_child, daemon=False,
                                           args=(program, list(args), str(cwd), env, self._out, self._err))
        self._process.start()
        _runs.add(self)
        self.pid = self._process.pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and not self._process.is_alive():
            self._process.join()
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        if self._output is None:
            self._output = self._read(self._out), self._read(self._err)
            shutil.rmtree(self._dir, ignore_errors=True)
        return self._output

    @staticmethod
    def _read(path: str) -> str:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start(args: Sequence[str], cwd: Path, env: dict[str, str] | None = None,
          program: str = "rl-train") -> ForkedRun | subprocess.Popen:
    """`program args` (rl-train, rl-eval or rl-report) started in `cwd`, forked where it can be (see the module
    docstring), with piped output."""
    if forkable(args, dict(os.environ) if env is None else env):
        return ForkedRun(program, list(args), cwd, dict(os.environ) if env is None else env)
    return subprocess.Popen([str(BIN / program), *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def run(args: Sequence[str], cwd: Path, timeout: float = 600, env: dict[str, str] | None = None,
        program: str = "rl-train") -> subprocess.CompletedProcess:
    """`program args` to its end, as subprocess.run(capture_output=True, text=True) gives it."""
    proc = start(args, cwd, env, program)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    assert proc.returncode is not None
    return subprocess.CompletedProcess([str(BIN / program), *args], proc.returncode, out, err)
