"""The loop is collect, update, callbacks: the run's own steps are `rlcli.Callback`s at the same points as a user's
(run/builtin_callbacks.py). What a user's callback sees: the order of the points, the RunContext's logger and
iteration, a stop from after_iteration, an update the non-finite guard undid; and the list the trainer runs."""

import pytest

import rlcli
from rlcli.run.callbacks import Callback, CallbackList, Iteration, RunContext

TINY = {"total_steps": 1024, "test_every": 512, "test_episodes": 2, "log_every": 512, "checkpoint_every": 512}
QUIET = {"console": False}
SMALL = ["algo=ppo", "env=CartPole-v1", "algo.n_steps=64", "algo.batch_size=64", "train.num_envs=4"]


class Points(rlcli.Callback):
    """Notes every point it is called at, and checks what the RunContext holds there."""

    def __init__(self):
        self.seen = []

    def on_start(self, run):
        assert run.iteration is None
        run.logger.message("my callback's line")  # the log is open before the user's on_start
        self.seen.append("start")

    def after_collect(self, run, stats):
        it = run.iteration
        assert it.stats is stats and run.env_steps == it.previous + stats.steps and not it.metrics
        self.seen.append(("collect", it.previous))

    def before_update(self, run):
        self.seen.append("before_update")

    def after_update(self, run, metrics):
        assert metrics is run.iteration.metrics and "policy_loss" in metrics and run.state.updates >= 1
        self.seen.append("update")

    def after_iteration(self, run):
        assert run.iteration.sps > 0 and run.sps > 0
        self.seen.append("iteration")

    def after_test(self, run, result):
        self.seen.append(("test", run.env_steps))

    def on_checkpoint(self, run, path):
        self.seen.append(("checkpoint", path.name))

    def on_end(self, run, reason):
        self.seen.append(("end", reason))


def test_a_users_callback_sees_every_point_in_the_loops_order(tmp_path):
    points = Points()
    run = rlcli.train(SMALL, train=TINY, log=QUIET, run_dir=tmp_path / "run", callbacks=[points])
    assert (run.env_steps, run.stop_reason, run.finished) == (1024, "budget", True)
    one = ["before_update", "update", "iteration"]  # 256 env steps an iteration
    assert points.seen == ["start",
                           ("collect", 0), *one,
                           ("collect", 256), *one, ("test", 512), ("checkpoint", "ckpt_000000000512.pt"),
                           ("collect", 512), *one,
                           ("collect", 768), *one, ("test", 1024),
                           ("checkpoint", "ckpt_000000001024.pt"), ("end", "budget")]
    log = (run.run_dir / "train.log").read_text()
    assert log.index("rlcli: ppo on CartPole-v1") < log.index("my callback's line")


def test_a_stop_from_after_iteration_ends_the_run_there_saved_and_resumable(tmp_path):
    class Plateau(rlcli.Callback):
        def after_iteration(self, run):
            return "plateau" if run.env_steps >= 512 else None

    run = rlcli.train(SMALL, train={**TINY, "checkpoint_every": 256}, log=QUIET, run_dir=tmp_path / "run",
                      callbacks=[Plateau()])
    assert (run.env_steps, run.stop_reason, run.finished) == (512, "plateau", False)
    # the test phase of that iteration still ran; the stop's checkpoint is the final one, not the cadence's too
    assert [p.name for p in sorted((run.run_dir / "checkpoints").glob("ckpt_*.pt"))] == [
        "ckpt_000000000256.pt", "ckpt_000000000512.pt"]
    assert run.final_test_return is not None
    assert "stopped by a callback (plateau) at 512 env steps" in (run.run_dir / "train.log").read_text()


def test_an_off_policy_warm_up_has_iterations_without_updates(tmp_path):
    points = Points()
    run = rlcli.train(["algo=dqn", "env=CartPole-v1", "algo.learning_starts=10000", "algo.train_freq=4"],
                      train={"total_steps": 64, "test_every": 0, "num_envs": 4}, log=QUIET,
                      run_dir=tmp_path / "run", callbacks=[points])
    assert run.env_steps == 64  # 4 iterations of 16 env steps, none of them learning
    assert "before_update" not in points.seen and "update" not in points.seen
    assert points.seen.count("iteration") == len([p for p in points.seen if p[0] == "collect"]) == 4


def test_an_update_the_guard_skipped_shows_as_nonfinite_events(tmp_path):
    class Seen(rlcli.Callback):
        def __init__(self):
            self.metrics = []

        def after_update(self, run, metrics):
            self.metrics.append(dict(metrics))

    seen = Seen()
    with pytest.raises(rlcli.RlcliError, match="more than train.max_nonfinite=1"):
        rlcli.train([*SMALL, "algo.schedules.lr=step:0.0003:1e30:0.5"], log=QUIET, run_dir=tmp_path / "run",
                    train={**TINY, "total_steps": 4096, "on_nonfinite": "skip", "max_nonfinite": 1}, callbacks=[seen])
    skipped = [m for m in seen.metrics if "nonfinite_events" in m]
    scheduled = {k for k in seen.metrics[0] if k.startswith("schedule_")}  # lr and PPO's clip range
    assert len(skipped) == 1 and set(skipped[0]) == {"nonfinite_events", *scheduled} and "schedule_lr" in scheduled
    assert skipped[0]["nonfinite_events"] == 1.0 and "policy_loss" in seen.metrics[0]


# ------------------------------------------------------------------ the mechanism itself
def _context(tmp_path):
    from rlcli.run.state import TrainState

    return RunContext(tmp_path, TrainState(), algo=None, config=None, iteration=Iteration(previous=0, stats=None))


def test_a_stop_at_after_iteration_is_the_iterations_at_once_and_the_first_wins(tmp_path):
    seen = []

    class Asks(Callback):
        def __init__(self, reason):
            self.reason = reason

        def after_iteration(self, run):
            seen.append(run.iteration.stop)
            return self.reason

    run = _context(tmp_path)
    assert CallbackList([Asks(None), Asks("first"), Asks(True), Asks(None)]).after_iteration(run) == "first"
    assert seen == [None, None, "first", "first"] and run.iteration.stop == "first" and run.iteration.ends_early
    run.iteration.last_phase = True  # at the budget's end a stop is simply the end
    assert not run.iteration.ends_early


def test_the_new_points_are_checked_like_the_others(tmp_path):
    class NoRun(Callback):
        def after_iteration(self):
            return None

    with pytest.raises(TypeError, match=r"NoRun.after_iteration must take \(self, run\)"):
        CallbackList([NoRun()])
    with pytest.raises(RuntimeError, match="logger opens at on_start"):
        _ = _context(tmp_path).logger


def test_the_trainer_runs_one_list_of_callbacks_with_the_users_among_the_runs_own(tmp_path, monkeypatch):
    from rlcli.run import builtin_callbacks as b
    from rlcli.run.divergence import NonfiniteGuard

    class Mine(Callback):
        pass

    class FakeTrainer:
        c = None
        options = type("Options", (), {"typed_keys": None})()
        guard = NonfiniteGuard.__new__(NonfiniteGuard)

        def save(self):
            return tmp_path

        def close(self):
            pass

        def stop_on_signal(self):
            pass

    monkeypatch.setattr(b, "tb_cadence", lambda c: 1)  # Logging's cadence, without components
    mine = Mine()
    listed = b.builtin_callbacks(FakeTrainer(), [mine])
    assert all(isinstance(callback, Callback) for callback in listed)
    names = [type(callback).__name__ for callback in listed]
    assert names == ["BudgetWarnings", "FinalCheckpoint", "RunLog", "NonfiniteGuard", "Mine", "Schedules",
                     "TestPhase", "Video", "Logging", "StopMessage", "SignalSafePoint", "Checkpoints"]
