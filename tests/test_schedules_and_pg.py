"""Generic schedules, the adaptive KL rule, and REINFORCE without a baseline."""

from pathlib import Path

import pytest
import torch
from conftest import at
from offline_fixtures import dataset_file
from test_configs import composed

from rlcli.algos.ppo import adapt_kl_coef
from rlcli.registry import ALGOS, ConfigError
from rlcli.run.build import build
from rlcli.schedules import apply_schedules, build_schedules, parse_schedule


@pytest.mark.parametrize(("text", "at", "expected"), [
    ("constant:0.3", 0.7, 0.3),
    ("linear:0.01:0.0", 0.0, 0.01), ("linear:0.01:0.0", 0.5, 0.005), ("linear:0.01:0.0", 1.0, 0.0),
    ("linear:0.01:0.0", 1.5, 0.0),  # progress is clamped to [0, 1]
    ("exp:1e-3:1e-5", 0.5, 1e-4), ("exp:1e-3:1e-5", 1.0, 1e-5),
    ("step:1.0:0.1:0.25", 0.2, 1.0), ("step:1.0:0.1:0.25", 0.25, 0.1),
    ("linear:1.0:0.05:0.1", 0.05, 0.525), ("linear:1.0:0.05:0.1", 0.5, 0.05),  # reaches B at progress 0.1
    ("linear:1.0:0.05:0.0", 0.0, 0.05),
])
def test_schedule_values(text, at, expected):
    assert parse_schedule("x", text)(at) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["linear:0.01", "cosine:1:0", "linear:a:b", ""])
def test_bad_schedule_strings_name_the_forms(text):
    with pytest.raises(ConfigError, match="algo.schedules.ent_coef=.*linear:A:B"):
        parse_schedule("ent_coef", text)


@pytest.mark.parametrize(("text", "why"), [("exp:0:1", "two positive values"), ("step:1:0:2", "progress in")])
def test_bad_schedule_values_say_why(text, why):
    with pytest.raises(ConfigError, match=why):
        parse_schedule("lr", text)


def test_apply_sets_attributes_and_every_optimizer_lr():
    class Algo:
        def __init__(self):
            self.ent_coef, self.n_epochs = 0.01, 10
            self.optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)

        default_schedules: dict = {}
        schedulable = ("ent_coef",)

        def optimizers(self):
            return [self.optimizer]

    algo = Algo()
    schedules = build_schedules(algo, {"ent_coef": "linear:0.02:0.0", "lr": "constant:0.5"})
    values = apply_schedules(schedules, 0.25)
    assert algo.ent_coef == pytest.approx(0.015) and algo.optimizer.param_groups[0]["lr"] == 0.5
    assert values == {"ent_coef": pytest.approx(0.015), "lr": 0.5}
    with pytest.raises(ConfigError, match="no numeric parameter 'n_epochs'"):  # counts are not schedulable
        build_schedules(algo, {"n_epochs": "linear:10:1"})


def test_settings_become_default_schedules_with_todays_arithmetic():
    """DQN's exploration_* keys, lr_schedule=linear and PER's beta -> beta_final are schedules of the one
    mechanism, with the formulas the algorithms used before (bit for bit)."""
    parts = build(composed("algo=dqn", "env=CartPole-v1", "buffer=per", "algo.exploration_fraction=0.2",
                           "algo.exploration_initial_eps=1.0", "algo.exploration_final_eps=0.1"))
    names = {item.name for item in parts.schedules}
    assert names == {"epsilon", "beta"}
    for progress in (0.0, 0.05, 0.1999, 0.2, 0.7, 1.0):
        apply_schedules(parts.schedules, progress)
        assert parts.algo.epsilon == 1.0 + (0.1 - 1.0) * min(1.0, progress / 0.2)
        assert parts.buffer.beta == 0.4 + (1.0 - 0.4) * min(1.0, progress)
    parts.close()
    parts = build(composed("algo=ppo", "env=CartPole-v1"))  # RL-Zoo's tuned lr and clip_range: linear to 0
    apply_schedules(parts.schedules, 0.3)
    assert parts.algo.lr_scale == max(0.0, 1.0 - 0.3) and parts.algo.clip_range_scale == 1.0 - 0.3
    metrics = parts.algo.update(parts.buffer, at(0.3))
    assert float(metrics["learning_rate"]) == pytest.approx(1e-3 * 0.7)
    assert float(metrics["clip_range"]) == pytest.approx(0.2 * 0.7)
    parts.close()


def test_an_explicit_schedule_replaces_the_default_of_the_same_value():
    parts = build(composed("algo=ppo", "env=CartPole-v1", "++algo.schedules.lr=constant:5e-4"))
    assert {item.name for item in parts.schedules} == {"lr", "clip_range_scale"}  # lr_scale gave way to lr
    parts.close()
    parts = build(composed("algo=dqn", "env=CartPole-v1", "++algo.schedules.epsilon=constant:0.3"))
    apply_schedules(parts.schedules, 0.0)
    assert parts.algo.epsilon == 0.3
    parts.close()


def test_kl_coefficient_adaptation_follows_the_paper():
    assert adapt_kl_coef(1.0, 0.001, 0.01) == 0.5  # moved less than target / 1.5
    assert adapt_kl_coef(1.0, 0.02, 0.01) == 2.0  # more than 1.5 x target
    assert adapt_kl_coef(1.0, 0.01, 0.01) == 1.0
    assert adapt_kl_coef(1.0, 0.0067, 0.01) == 1.0 and adapt_kl_coef(1.0, 0.0149, 0.01) == 1.0


def test_ppo_kl_update_adapts_its_coefficient(tmp_path):
    cfg = composed("algo=ppo_kl", "env=CartPole-v1", "algo.n_steps=32", "algo.n_epochs=2", "algo.batch_size=64",
                   "algo.kl_target=1e-9", "log.console=false", "log.tensorboard=false")
    parts = build(cfg)
    parts.collector.collect(parts.learner)
    metrics = parts.algo.update(parts.buffer, at(0.0))
    assert "clip_fraction" not in metrics and float(metrics["kl_coef"]) == 1.0
    assert parts.algo.kl_coef == 2.0  # any movement is far above a target of 1e-9
    parts.close()


def test_pg_without_baseline_uses_plain_discounted_returns():
    cfg = composed("algo=pg", "env=CartPole-v1", "algo.baseline=false", "algo.n_steps=16", "algo.gamma=0.5",
                   "train.num_envs=1", "log.console=false", "log.tensorboard=false")
    parts = build(cfg)
    parts.collector.collect(parts.learner)
    batch = parts.buffer.flat()
    assert torch.all(batch.values == 0)
    # CartPole pays 1 per step; with b = 0 the advantage is the discounted return-to-go (cut at the rollout end)
    adv, mask = batch.advantages, batch.mask
    assert torch.all(adv[mask > 0] <= 2.0) and torch.all(adv[mask > 0] >= 1.0)
    assert adv[-1] == pytest.approx(1.0) or mask[-1] == 0
    parts.close()




def test_every_algorithm_declares_what_it_schedules_and_its_defaults_are_among_them():
    """`schedulable` names settings the algorithm holds as numbers (or None: off until scheduled); every default
    schedule sets one of them (or lr_scale, which every algorithm with optimizers has)."""
    from test_resume import CASES, budget  # one small, buildable config per algorithm

    from rlcli.registry import ALGOS

    for name in ALGOS.names():
        case = next(c for c in CASES if c.split("-")[0] == name)
        args = [("+" + a if a.startswith("algo.schedules.") else a) for a in budget(case)]
        parts = build(composed(*args))
        try:
            algo = parts.algo
            assert algo.optimizers(), name
            for key in algo.schedulable:
                value = getattr(algo, key)
                assert value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)), (name, key)
            assert set(algo.default_schedules) <= {*algo.schedulable, "lr_scale"}, name
        finally:
            parts.close()


@pytest.mark.parametrize(("args", "message"), [
    (["algo=sac", "algo.ent_coef=auto", "+algo.schedules.ent_coef=linear:0.1:0.0"], "no numeric parameter 'ent_coef'"),
    (["algo=tqc", "+algo.schedules.n_quantiles=linear:25:5"], "no numeric parameter 'n_quantiles'"),
])
def test_settings_a_schedule_cannot_move_are_refused(args, message):
    with pytest.raises(ConfigError, match=message):
        build(composed(*args, "env=Pendulum-v1"))


def test_a_fixed_sac_temperature_follows_its_schedule():
    parts = build(composed("algo=sac", "env=Pendulum-v1", "algo.ent_coef=0.1",
                           "+algo.schedules.ent_coef=linear:0.1:0.0"))
    try:
        apply_schedules(parts.schedules, 0.5)
        assert parts.algo.temperature.fixed == pytest.approx(0.05)
        assert parts.algo.alpha().item() == pytest.approx(0.05)
    finally:
        parts.close()


def test_every_algorithms_schedule_example_in_its_yaml_builds():
    """The example in each conf/algo/<name>.yaml's `schedules:` comment names a setting that can be scheduled."""
    import re

    from rlcli.run.compose import conf_dir

    for path in sorted((Path(conf_dir()) / "algo").glob("*.yaml")):
        example = re.search(r"schedules: \{\}.*?(algo\.schedules\.\w+=\S+)", path.read_text())
        if example is None:
            continue
        # an env whose actions the algorithm takes, from its registered spec (no list of names to extend)
        env = {"maskable_ppo": "ValidMoves-v0", "rnd_ppo": "MountainCar-v0"}.get(path.stem)
        data = []
        if env is None and ALGOS.spec(path.stem).offline:  # learns from a dataset recorded on the env it tests in
            env = "Pendulum-v1" if "Box" in ALGOS.spec(path.stem).action_spaces else "CartPole-v1"
            data = [f"dataset={dataset_file('pendulum' if env == 'Pendulum-v1' else 'cartpole')}"]
        if env is None:
            env = "Acrobot-v1" if "Discrete" in ALGOS.spec(path.stem).action_spaces else "Pendulum-v1"
        parts = build(composed(f"algo={path.stem}", f"env={env}", "+" + example.group(1), *data))
        parts.close()
