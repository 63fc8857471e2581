"""Training a sweep's jobs as one batched population (`hydra/launcher=population`).

Each member is a whole rlcli run (its own envs, collector, storage, schedules, test phases, checkpoints and run
directory); what the members share is the arithmetic of the update: their networks' weights live in stacked
[members, ...] tensors, each member's modules hold views into them, and one vectorized (`torch.func.vmap`) call
computes every member's loss and gradients at once.
"""
