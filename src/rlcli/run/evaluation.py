"""A run's test phases: deterministic episodes on the test envs, the best model, and recorded episodes."""

from __future__ import annotations

from pathlib import Path

from rlcli.collectors.testing import TestStats, evaluate
from rlcli.run.build import Components
from rlcli.run.state import TrainState, save_best
from rlcli.services.log import RunLogger, fmt_return


def test_seed(c: Components, state: TrainState) -> int:
    """The seed of the next test phase's envs (env i: this + i), its own per phase."""
    return int(c.cfg.seed) + 100_003 * (state.tests + 1)


def test_phase(c: Components, state: TrainState, run_dir: Path, log: RunLogger,
               result: TestStats | None = None) -> TestStats:
    """One episode per test env (env i from a seed of its own per phase), the counters and best.pt updated, and
    every episode's return and length recorded (eval.jsonl, TensorBoard). `result`: the episodes, when the caller
    ran them (a population runs its members' test episodes together, sweeps/population/testing.py)."""
    if result is None:
        result = evaluate(c.test_envs, c.algo, c.algo.networks.normalizer, c.device, seed=test_seed(c, state),
                          obs_dtype=c.obs_dtype, carry_size=c.carry_size, masks=c.spec.action_masks)
    state.tests += 1
    state.last_test_return = result.mean_return
    best = state.best_test_return
    state.best_test_return = result.mean_return if best is None else max(best, result.mean_return)
    if best is None or result.mean_return > best:
        save_best(c, state, run_dir)
        state.stale_best = False  # this run's own best replaced the stopped run's later one
        log.scalars({"eval/best_return": result.mean_return}, state.env_steps)
        log.message(f"new best test return {fmt_return(result.mean_return)} at {state.env_steps:,} {c.unit}: "
                    "checkpoints/best.pt")
    scalars = {"eval/return_mean": result.mean_return, "eval/return_std": float(result.returns.std()),
               "eval/ep_len_mean": float(result.lengths.mean())}
    score = None if c.offline is None else c.offline.dataset.normalized_score(result.mean_return)
    if score is not None:  # D4RL's normalized score, where the dataset has reference returns
        scalars["eval/normalized_score"] = score
    extra: dict[str, object] = {} if score is None else {"normalized_score": score}
    if result.agent_returns:  # env=pz: returns are team sums; each agent's own return beside them
        scalars.update({f"eval/return_{name}": float(r.mean()) for name, r in result.agent_returns.items()})
        extra["agent_returns"] = {name: r.tolist() for name, r in result.agent_returns.items()}
        for group, r in (result.group_returns or {}).items():  # env.groups: each group's sum of its agents' returns
            scalars[f"eval/group_return_{group}"] = float(r.mean())
        if result.group_returns:
            extra["group_returns"] = {group: r.tolist() for group, r in result.group_returns.items()}
        if result.team_returns is not None:  # over every agent of the env: the group's sum plus those outside it
            extra["team_returns"] = result.team_returns.tolist()
            if not (result.team_returns == result.returns).all():
                scalars["eval/team_return_mean"] = float(result.team_returns.mean())
    log.scalars(scalars, state.env_steps)
    log.test_result(state.env_steps, result.returns.tolist(), result.lengths.tolist(), extra)
    return result


def record_video(c: Components, steps: int, run_dir: Path, log: RunLogger) -> None:
    """One deterministic test episode to videos/step-<env steps>-ep0-return<R>.<fmt>, and to TensorBoard.
    It draws no random numbers from the run, so a resumed run trains exactly as an unbroken one."""
    from rlcli.services import video

    assert c.video_envs is not None
    fps = video.frames_per_second(c.video_envs)
    sink = video.VideoSink(run_dir / "videos", f"step-{steps:012d}", c.cfg.log.get("video_format", "mp4"),
                           fps, count=1, keep_every=1 if log.writer is not None else 0)
    try:
        result = evaluate(c.video_envs, c.algo, c.algo.networks.normalizer, c.device,
                          seed=int(c.cfg.seed) + 7_919 * (steps // max(1, int(c.cfg.log.video_every))),
                          obs_dtype=c.obs_dtype, carry_size=c.carry_size, frames=sink, masks=c.spec.action_masks)
    finally:
        sink.close()
    (recording,) = sink.finish(result.returns, result.lengths)
    if log.writer is not None and sink.kept:
        video.add_to_tensorboard(log.writer, "eval/video", sink.kept, steps, fps)
    log.message(f"video of a test episode at {steps:,} env steps (return {fmt_return(recording.episode_return)}): "
                f"{recording.path.relative_to(run_dir)}")
