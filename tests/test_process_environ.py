"""What rlcli run in-process (the Python API, a sweep's pre-check, the tests' own calls) leaves in os.environ: the
variables a sweep sets for its jobs end with the sweep, so a later run in the same process behaves as a fresh one."""

import os

from test_python_api import QUIET

import rlcli
from rlcli.run.budget import SAID_BY_SWEEP

WARNING = "warning: train.total_steps=600 is not a whole number of collect phases"
# a budget that rounds up to whole rollouts (600 -> 768 env steps: one is 32 x 8 envs), which a run says
SMALL = ["algo=ppo", "env=CartPole-v1", "train.total_steps=600", "train.test_every=0"]


def test_a_sweeps_precheck_in_this_process_leaves_the_next_run_saying_its_budget_warning(tmp_path, capsys):
    """precheck_sweep says the jobs' budget warnings once for the sweep; it used to leave
    RLCLI_SWEEP_SAID_BUDGET_WARNINGS=1 in this process's environment, and every later run of the process (and the
    processes it started) then wrote its own budget warning to its train.log only, never to the terminal."""
    from rlcli.entry.rl_train import precheck_sweep

    before = os.environ.pop(SAID_BY_SWEEP, None)
    try:
        precheck_sweep(["seed=0,1", *SMALL, "log.console=false", "log.tensorboard=false"])
        assert capsys.readouterr().err.count(WARNING) == 1  # the sweep's own line, once
        assert SAID_BY_SWEEP not in os.environ
        run = rlcli.train(SMALL, log=QUIET, run_dir=tmp_path / "run")
        assert capsys.readouterr().err.count(WARNING) == 1, "a later run's budget warning went to its train.log only"
        assert WARNING in (run.run_dir / "train.log").read_text()
    finally:
        os.environ.pop(SAID_BY_SWEEP, None)
        if before is not None:
            os.environ[SAID_BY_SWEEP] = before
