"""The run: config -> components (build), the loop (trainer) and its callbacks, test phases, what a checkpoint
holds, resume, the run-dir lock and how a run stops. Imports nothing itself."""
