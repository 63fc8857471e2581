"""rlcli's population launcher for Hydra: `hydra/launcher=population` (see rlcli/sweeps/population/)."""
