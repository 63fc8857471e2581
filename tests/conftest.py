import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RL_TRAIN = Path(sys.executable).parent / "rl-train"


def run_cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `rl-train` as a user would, in `cwd`, and capture what it printed."""
    env = dict(os.environ, HYDRA_FULL_ERROR="0")
    return subprocess.run([str(RL_TRAIN), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture
def cli(tmp_path):
    return lambda *args, **kw: run_cli(*args, cwd=tmp_path, **kw)


def at(progress: float):
    """The run clock at `progress` of a 1,000-step budget, for calling `algo.update` directly."""
    from rlcli.contracts import RunClock

    return RunClock(int(progress * 1000), 1000)
