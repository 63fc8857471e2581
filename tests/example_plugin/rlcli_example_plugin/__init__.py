"""An example rlcli plugin: one on-policy algorithm and its config."""
