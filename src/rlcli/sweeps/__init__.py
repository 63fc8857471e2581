"""Multirun: each job's status and the sweep's summary, the Optuna sweeper, and the population launcher."""
