"""`hydra/launcher=ray` (and rlcli's `ray_cluster`) as rl-train runs it. rl-train sets this class as the launcher's
`_target_` (entry/rl_train.py), so users keep typing the same launcher and every `hydra.launcher.ray.*` option stays.

What it adds: Ctrl-C / SIGTERM to rl-train cancel the sweep's Ray tasks. A running job gets the interrupt as a
SIGINT, stops at its next safe point with a checkpoint, and its record says `interrupted`. A waiting job does not
start. (rlcli/sweeps/ray_jobs.py has the launch.)"""

from collections.abc import Sequence
from typing import Any

try:  # the `ray` extra; without it this module offers nothing and rl-train keeps Hydra's own target
    from hydra_plugins.hydra_ray_launcher.ray_launcher import RayLauncher
except ImportError:  # pragma: no cover - the base install
    RayLauncher = None

if RayLauncher is not None:

    class RayJobsLauncher(RayLauncher):  # type: ignore[misc,valid-type]
        def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
            from rlcli.sweeps.ray_jobs import launch_on_ray

            return launch_on_ray(self, job_overrides, initial_job_idx)
