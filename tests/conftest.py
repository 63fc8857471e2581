import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import forked_cli
import pytest

REPO = Path(__file__).resolve().parents[1]
RL_TRAIN = Path(sys.executable).parent / "rl-train"


# Python code for a test script: `lose_a_sigterm()` sends this process SIGTERM from inside a weakref callback, where
# Python ignores what the handler raises (as in importlib's module-lock callback, where CI once saw it happen)
LOSE_A_SIGTERM = """
import gc, os, signal, weakref


def lose_a_sigterm():
    class Held:
        pass

    def callback(_):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10_000):
            pass

    held = Held()
    ref = weakref.ref(held, callback)
    del held
    gc.collect()
"""


def pytest_configure(config):
    """src/'s modules byte-compiled once (into their __pycache__/, as any run without PYTHONDONTWRITEBYTECODE would
    leave them), before the workers start. Where that variable is set (this machine's environment) nothing writes
    them, and every process the suite starts compiled the rlcli modules it imports from source: a forked `rl-train`
    those it imports lazily (an algorithm, the sweeps, src/hydra_plugins), a fresh one, a sweep's or Ray's worker all
    of them (~0.5-1 s each here). Python still compiles a module whose source is newer than its .pyc."""
    if not hasattr(config, "workerinput"):  # pytest-xdist's controller (or a run without it), not each worker
        import compileall

        compileall.compile_dir(REPO / "src", quiet=1)


def run_cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `rl-train` as a user would, in `cwd`, and capture what it printed (a process forked from one that
    imported rlcli already, where it can be: tests/forked_cli.py)."""
    return forked_cli.run(args, cwd, timeout=timeout, env=dict(os.environ, HYDRA_FULL_ERROR="0"))


@pytest.fixture
def cli(tmp_path):
    return lambda *args, **kw: run_cli(*args, cwd=tmp_path, **kw)


def at(progress: float):
    """The run clock at `progress` of a 1,000-step budget, for calling `algo.update` directly."""
    from rlcli.contracts import RunClock

    return RunClock(int(progress * 1000), 1000)


@pytest.fixture
def ray_exclusive():
    """Tests that start Ray run one at a time, also across pytest-xdist workers: `ray stop --force` in one
    would stop the Ray of another (an exclusive lock on a file; pytest-xdist's groups are not kept by pytest 9)."""
    with open(Path(tempfile.gettempdir()) / "rlcli-tests-ray.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def ray_cluster_on_localhost(num_cpus: int = 2):
    """A one-node Ray cluster on 127.0.0.1 (loopback only) for the block, then `ray stop --force` (which stops
    every Ray on the machine: use it in tests with the `ray_exclusive` fixture). Yields (port, env for clients)."""
    ray = Path(sys.executable).parent / "ray"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay under 108 bytes
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",  # keeps Ray on the loopback address
               RAY_USAGE_STATS_ENABLED="0", HYDRA_FULL_ERROR="0")
    start = [str(ray), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", f"--num-cpus={num_cpus}",
             "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp_dir}"]
    subprocess.run(start, check=True, capture_output=True, env=env, timeout=120)
    try:
        yield port, env
    finally:
        subprocess.run([str(ray), "stop", "--force"], capture_output=True, env=env, timeout=120)
        shutil.rmtree(temp_dir, ignore_errors=True)
