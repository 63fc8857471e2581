"""The Optuna wiring: a job reports test returns to its trial and stops when the pruner says so."""

from types import SimpleNamespace

from omegaconf import OmegaConf
from test_configs import composed

from rlcli.run.callbacks import Callback
from rlcli.sweeps.jobs import read_status, run_job
from rlcli.sweeps.tuning import open_study, trial_reporter


def test_reporter_prunes_a_trial_far_below_the_median(tmp_path):
    import optuna

    journal = tmp_path / "optuna.journal"
    study = open_study(journal, "s", pruner=optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0))
    good = study.ask()
    good.report(400.0, 1000)
    study.tell(good, 400.0)
    trial = study.ask()
    cfg = OmegaConf.create({"sweep": {"trial": {"journal": str(journal), "study": "s", "number": trial.number,
                                                "report": True, "pruner": "median", "startup": 1, "warmup": 0}}})
    reporter = trial_reporter(cfg)

    def tested(test_return, env_steps):
        run = SimpleNamespace(state=SimpleNamespace(last_test_return=test_return, env_steps=env_steps))
        return reporter.after_test(run, None)

    assert tested(500.0, 1000) is None  # above the median
    assert tested(5.0, 2000) is None  # no peer at this step
    hopeless = study.ask()
    cfg.sweep.trial.number = hopeless.number
    reporter = trial_reporter(cfg)
    assert tested(5.0, 1000) == "pruned"
    stored = study.get_trials()[hopeless.number].intermediate_values
    assert stored == {1000: 5.0}


def test_reporter_is_off_outside_sweeps_and_for_other_seeds():
    assert trial_reporter(OmegaConf.create({"sweep": {"trial": None}})) is None
    assert trial_reporter(OmegaConf.create({"sweep": {"trial": {"report": False}}})) is None


def test_a_pruned_job_stops_at_its_test_and_says_so(tmp_path):
    cfg = composed("algo=ppo", "env=CartPole-v1", "train.total_steps=4096", "train.test_every=512",
                   "train.test_episodes=2", "train.num_envs=2", "algo.n_steps=64", "algo.batch_size=64",
                   "log.console=false", "log.tensorboard=false")
    class PruneAtTheSecondTest(Callback):
        def after_test(self, run, result):
            return "pruned" if run.state.tests >= 2 else None

    record = run_job(cfg, tmp_path, 7, ["seed=1"], lambda cfg: PruneAtTheSecondTest())
    assert record["status"] == "pruned" and record["env_steps"] == 1024
    assert read_status(tmp_path)["status"] == "pruned"
