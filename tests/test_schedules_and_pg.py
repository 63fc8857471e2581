"""Generic schedules, the adaptive KL rule, and REINFORCE without a baseline."""

import pytest
import torch
from conftest import at
from test_configs import composed

from rlcli.algos.ppo import adapt_kl_coef
from rlcli.build import build
from rlcli.registry import ConfigError
from rlcli.schedules import apply_schedules, build_schedules, parse_schedule


@pytest.mark.parametrize(("text", "at", "expected"), [
    ("constant:0.3", 0.7, 0.3),
    ("linear:0.01:0.0", 0.0, 0.01), ("linear:0.01:0.0", 0.5, 0.005), ("linear:0.01:0.0", 1.0, 0.0),
    ("linear:0.01:0.0", 1.5, 0.0),  # progress is clamped to [0, 1]
    ("exp:1e-3:1e-5", 0.5, 1e-4), ("exp:1e-3:1e-5", 1.0, 1e-5),
    ("step:1.0:0.1:0.25", 0.2, 1.0), ("step:1.0:0.1:0.25", 0.25, 0.1),
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

    algo = Algo()
    schedules = build_schedules(algo, {"ent_coef": "linear:0.02:0.0", "lr": "constant:0.5"})
    values = apply_schedules(algo, schedules, 0.25)
    assert algo.ent_coef == pytest.approx(0.015) and algo.optimizer.param_groups[0]["lr"] == 0.5
    assert values == {"ent_coef": pytest.approx(0.015), "lr": 0.5}
    with pytest.raises(ConfigError, match="no numeric parameter 'n_epochs'"):  # counts are not schedulable
        build_schedules(algo, {"n_epochs": "linear:10:1"})


def test_kl_coefficient_adaptation_follows_the_paper():
    assert adapt_kl_coef(1.0, 0.001, 0.01) == 0.5  # moved less than target / 1.5
    assert adapt_kl_coef(1.0, 0.02, 0.01) == 2.0  # more than 1.5 x target
    assert adapt_kl_coef(1.0, 0.01, 0.01) == 1.0
    assert adapt_kl_coef(1.0, 0.0067, 0.01) == 1.0 and adapt_kl_coef(1.0, 0.0149, 0.01) == 1.0


def test_ppo_kl_update_adapts_its_coefficient(tmp_path):
    cfg = composed("algo=ppo_kl", "env=CartPole-v1", "algo.n_steps=32", "algo.n_epochs=2", "algo.batch_size=64",
                   "algo.kl_target=1e-9", "log.console=false", "log.tensorboard=false")
    parts = build(cfg)
    parts.collector.collect(parts.algo, parts.buffer, 0.0)
    metrics = parts.algo.update(parts.buffer, at(0.0))
    assert "clip_fraction" not in metrics and float(metrics["kl_coef"]) == 1.0
    assert parts.algo.kl_coef == 2.0  # any movement is far above a target of 1e-9
    parts.close()


def test_pg_without_baseline_uses_plain_discounted_returns():
    cfg = composed("algo=pg", "env=CartPole-v1", "algo.baseline=false", "algo.n_steps=16", "algo.gamma=0.5",
                   "train.num_envs=1", "log.console=false", "log.tensorboard=false")
    parts = build(cfg)
    parts.collector.collect(parts.algo, parts.buffer, 0.0)
    batch = parts.buffer.flat()
    assert torch.all(batch.values == 0)
    # CartPole pays 1 per step; with b = 0 the advantage is the discounted return-to-go (cut at the rollout end)
    adv, mask = batch.advantages, batch.mask
    assert torch.all(adv[mask > 0] <= 2.0) and torch.all(adv[mask > 0] >= 1.0)
    assert adv[-1] == pytest.approx(1.0) or mask[-1] == 0
    parts.close()


