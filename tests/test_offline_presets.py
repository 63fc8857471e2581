"""The tuned presets of the offline algorithms (conf/tuned/<algo>/Hopper-v5.yaml, CORL's hopper-medium-replay-v2
settings): `rl-train algo=<algo> dataset=<a Hopper-v5 dataset>` picks them by the dataset's env, and what each sets is
what the run builds. Nothing trains: a 200-step random-policy Hopper-v5 dataset is enough to build a run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from offline_fixtures import rollout_dataset
from omegaconf import OmegaConf
from torch import nn

from rlcli.actors.offpolicy import DeterministicPolicy
from rlcli.entry.rl_train import offline_env_args
from rlcli.registry import ALGOS
from rlcli.run.compose import compose_config, conf_dir
from rlcli.run.offline import read, reward_multiplier, settings_of
from rlcli.run.state import prepare

ALGOS_WITH_PRESETS = ("bc", "td3_bc", "rebrac", "iql", "cql", "awac")
SMALL = ["log.tensorboard=false", "log.console=false"]


def preset(algo: str) -> dict:
    return yaml.safe_load((Path(conf_dir()) / "tuned" / algo / "Hopper-v5.yaml").read_text())


@pytest.fixture(scope="module")
def hopper_dataset(tmp_path_factory) -> str:
    from rlcli.offline.save import save_npz

    def random_policy(obs, rng, t):
        return rng.uniform(-1.0, 1.0, size=(3,)).astype(np.float32)

    data = rollout_dataset("Hopper-v5", random_policy, 200, seed=0, name="hopper-random")
    return str(save_npz(data, tmp_path_factory.mktemp("hopper") / "hopper-random.npz", overwrite=True))


def build(algo: str, source: str, *more: str):
    """As rl-train does: the dataset's env added to the command line (offline_env_args), composed, then built."""
    args = offline_env_args([f"algo={algo}", f"dataset={source}", *SMALL, *more])
    assert "env=Hopper-v5" in args  # conf/env/Hopper-v5.yaml, so tuned: ${algo}/${env} is <algo>/Hopper-v5
    cfg = compose_config(args)
    components, _ = prepare(cfg, start_workers=False)
    return cfg, components


def hidden_widths(module: nn.Module) -> list[int]:
    """The out-features of every Linear layer but the last (the hidden sizes of one MLP)."""
    return [m.out_features for m in module.modules() if isinstance(m, nn.Linear)][:-1]


def optimizer_lrs(algo) -> dict[str, float]:
    return {name: opt.param_groups[0]["lr"] for name, opt in vars(algo).items()
            if hasattr(opt, "param_groups")}  # torch's optimizers and rlcli's fused Adam


@pytest.mark.parametrize("algo", ALGOS_WITH_PRESETS)
def test_each_preset_is_an_offline_only_algorithms_and_names_its_source(algo):
    # keyed by env alone, a preset of an algorithm that also trains online would change online runs too
    assert ALGOS.spec(algo).offline
    text = (Path(conf_dir()) / "tuned" / algo / "Hopper-v5.yaml").read_text()
    assert f"configs/offline/{algo}/hopper/medium_replay_v2.yaml" in text
    assert "No counterpart" in text


@pytest.mark.parametrize("algo", ALGOS_WITH_PRESETS)
def test_a_hopper_dataset_run_builds_what_its_preset_sets(algo, hopper_dataset):
    cfg, c = build(algo, hopper_dataset)
    try:
        values = preset(algo)
        # composed: every key the preset sets has its value in the run's config
        for section, keys in values.items():
            for key, value in keys.items():
                assert OmegaConf.select(cfg, f"{section}.{key}") == value, f"{section}.{key}"
        # built: the budget and test phases, in gradient steps
        for key, value in values["train"].items():
            assert getattr(c.settings, key) == value, f"train.{key}"
        # built: the dataset's statistics and reward scale
        data = read(hopper_dataset)
        settings = settings_of(cfg)
        assert (c.offline.settings.normalize_obs, c.offline.settings.reward_scale) == \
            (values["offline"]["normalize_obs"], values["offline"]["reward_scale"])
        normalizer = c.algo.networks.normalizer
        if values["offline"]["normalize_obs"]:
            assert float(normalizer.count) == len(data)
            assert torch.allclose(normalizer.mean.double(), torch.as_tensor(data.observations, dtype=torch.float64)
                                  .mean(0), atol=1e-5)
        else:
            assert torch.equal(normalizer.mean, torch.zeros_like(normalizer.mean))
        factor = reward_multiplier(data, settings)
        assert (factor != 1.0) == (values["offline"]["reward_scale"] == "returns")
        stored = c.buffer.rewards.reshape(-1)[:len(data)].cpu().numpy()
        np.testing.assert_allclose(stored, data.rewards * np.float32(factor), rtol=1e-6)
        # built: the networks' hidden layers
        net, sizes = c.algo.networks, values["actor"]["hidden_sizes"]
        assert hidden_widths(net.policy) == sizes
        if hasattr(net, "critics"):
            assert all(hidden_widths(q) == sizes for q in net.critics.nets)
        # built: each algo.* value the algorithm keeps under its own name, and the learning rates
        algo_values = values["algo"]
        for key, value in algo_values.items():  # (ent_coef reads None when learned: checked below)
            if key != "ent_coef" and (hasattr(type(c.algo), key) or key in vars(c.algo)):
                assert getattr(c.algo, key) == value, f"algo.{key}"
        lrs = optimizer_lrs(c.algo)
        if algo == "cql":
            assert lrs["critic_optimizer"] == algo_values["lr"] and lrs["alpha_prime_optimizer"] == algo_values["lr"]
            assert lrs["policy_optimizer"] == algo_values["policy_lr"]
            assert c.algo.temperature.optimizer.param_groups[0]["lr"] == algo_values["policy_lr"]
            assert c.algo.temperature.learned and c.algo.target_update_interval == 1
            assert (c.algo.cql_alpha, c.algo.cql_n_actions, c.algo.cql_temp, c.algo.importance_sample,
                    c.algo.lagrange, c.algo.target_gap, c.algo.backup_entropy) == (10.0, 10, 1.0, True, False,
                                                                                    -1.0, False)
        else:
            assert lrs and set(lrs.values()) == {algo_values["lr"]}, lrs
        if algo == "iql":
            assert isinstance(net.policy, DeterministicPolicy)
            assert (c.algo.tau, c.algo.expectile, c.algo.beta, c.algo.exp_adv_max) == (0.001, 0.7, 3.0, 100.0)
        if algo == "rebrac":
            assert (c.algo.actor_bc_coef, c.algo.critic_bc_coef, c.algo.batch_size) == (0.05, 0.5, 1024)
            assert not any(isinstance(m, nn.LayerNorm) for m in net.policy.modules())
            assert any(isinstance(m, nn.LayerNorm) for m in net.critics.modules())
        if algo in ("td3_bc", "rebrac"):
            assert (c.algo.policy_delay, c.algo.target_policy_noise, c.algo.target_noise_clip) == (2, 0.2, 0.5)
        if algo == "td3_bc":
            assert (c.algo.alpha, c.algo.noise.std) == (2.5, 0.1)
        if algo == "awac":
            assert (c.algo.awac_lambda, c.algo.tau, c.algo.exp_adv_max) == (0.3333, 0.005, 100.0)
    finally:
        c.close()


def test_no_tuned_drops_the_preset(hopper_dataset):
    cfg, c = build("iql", hopper_dataset, "~tuned")
    try:
        assert not isinstance(c.algo.networks.policy, DeterministicPolicy) and c.algo.tau == 0.005
        assert not cfg.offline.normalize_obs and cfg.offline.reward_scale == "none"
    finally:
        c.close()


def test_the_command_line_beats_the_preset(hopper_dataset):
    _, c = build("rebrac", hopper_dataset, "algo.actor_bc_coef=0.1", "offline.normalize_obs=true")
    try:
        assert (c.algo.actor_bc_coef, c.algo.critic_bc_coef) == (0.1, 0.5)
        assert c.offline.settings.normalize_obs
    finally:
        c.close()
