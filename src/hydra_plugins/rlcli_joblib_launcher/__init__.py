"""Hydra's joblib launcher as rl-train runs it: `hydra/launcher=joblib` with Ctrl-C / SIGTERM passed on to its
workers (see rlcli/sweeps/parallel_jobs.py)."""
