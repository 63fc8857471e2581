"""What the run and the parts use and that knows nothing of RL: files that survive faults (checkpoints, plain
state, JSON lines), the console/TensorBoard log, tracking, video, policy export, time and memory accounts,
process set-up."""
