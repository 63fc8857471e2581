"""Entry points: the console commands (rl-train, rl-eval, rl-report) and the Python API. Imports nothing, so
that `rlcli.entry.cli` can install its signal handlers before anything heavy loads."""
