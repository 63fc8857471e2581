"""Every shipped config composes, names a registered component, and passes the config checks."""


import pytest
from hydra import compose, initialize_config_dir

from rlcli.registry import ACTORS, ALGOS, BUFFERS, ENVS
from rlcli.run.build import check_config
from rlcli.run.compose import conf_dir, group_options

REGISTRIES = {"env": ENVS, "algo": ALGOS, "actor": ACTORS, "buffer": BUFFERS}


def composed(*overrides: str):
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3", job_name="test"):
        return compose("config", overrides=list(overrides))


@pytest.mark.parametrize(("group", "option"), [(g, o) for g in REGISTRIES for o in group_options(g)])
def test_every_group_option_composes_and_is_registered(group, option):
    overrides = [f"{group}={option}"] + (["env.id=CartPole-v1"] if option == "gym" else [])
    if group == "buffer" and option != "rollout":
        overrides.append("algo=dqn")  # replay buffers belong to off-policy algorithms
    cfg = composed(*overrides)
    assert cfg[group].name in REGISTRIES[group].names()
    check_config(cfg)


# every tuned file applying and building: tests/test_benchmark_envs.py (its nested keys checked too)


def test_ppo_cartpole_tuned_is_rl_zoo_exactly():
    cfg = composed("algo=ppo", "env=CartPole-v1")
    a = cfg.algo
    assert (cfg.train.num_envs, a.n_steps, a.batch_size, a.n_epochs) == (8, 32, 256, 20)
    assert (a.gae_lambda, a.gamma, a.ent_coef, a.lr, a.clip_range) == (0.8, 0.98, 0.0, 1e-3, 0.2)
    assert (a.lr_schedule, a.clip_range_schedule) == ("linear", "linear")
    assert cfg.train.total_steps == 100_000


def test_command_line_beats_tuned_values():
    assert composed("algo=ppo", "env=CartPole-v1", "algo.n_epochs=3").algo.n_epochs == 3


def test_all_classic_control_envs_are_shipped():
    shipped = set(group_options("env"))
    for env_id in ["CartPole-v0", "CartPole-v1", "MountainCar-v0", "MountainCarContinuous-v0",
                   "Pendulum-v1", "Acrobot-v1"]:
        assert env_id in shipped
