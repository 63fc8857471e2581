"""`hydra/launcher=joblib` as rl-train runs it. rl-train sets this class as the launcher's `_target_`
(entry/rl_train.py), so users keep typing `hydra/launcher=joblib` and every option of Hydra's plugin stays.

What it adds is what a sweep needs under signals and killed workers: Ctrl-C / SIGTERM to rl-train go on to the
worker processes, whose running jobs stop with their checkpoints while the waiting ones do not start
(rlcli/sweeps/parallel_jobs.py runs each job in its worker), and a worker killed from outside is one line."""

from collections.abc import Sequence
from typing import Any

try:  # the `sweep` extra; without it this module offers nothing and rl-train keeps Hydra's own target
    from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher
except ImportError:  # pragma: no cover - the base install
    JoblibLauncher = None

if JoblibLauncher is not None:

    class JoblibJobsLauncher(JoblibLauncher):  # type: ignore[misc,valid-type]
        def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
            from rlcli.sweeps.parallel_jobs import launch_stoppably

            assert self.config is not None
            return launch_stoppably(lambda: super(JoblibJobsLauncher, self).launch(job_overrides, initial_job_idx),
                                    str(self.config.hydra.sweep.dir))
