"""Hydra's Ray launcher as rl-train runs it: `hydra/launcher=ray` or `ray_cluster` with Ctrl-C / SIGTERM stopping
the jobs on the cluster with their checkpoints (see rlcli/sweeps/ray_jobs.py)."""
