"""rlcli's Optuna sweeper for Hydra: `hydra/sweeper=rlcli_optuna` (see rlcli/sweeps/tuning.py)."""
