"""Every rlcli algorithm's constructor defaults in Hydra's ConfigStore, wherever Hydra composes rlcli's configs
(see rlcli/run/algo_defaults.py)."""
