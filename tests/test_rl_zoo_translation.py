"""The tuned files that translate an RL-Zoo entry whole say what RL-Zoo says: every key of the stored entry
(tests/data/rl_zoo_entries.yaml) is one this test knows how to translate, and its rlcli value is what
`rl-train algo=<algo> env=<env>` composes to."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rlcli.registry import ALGOS
from rlcli.run.compose import conf_dir

ENTRIES_FILE = Path(__file__).parent / "data" / "rl_zoo_entries.yaml"
ENTRIES: dict[str, dict[str, Any]] = yaml.safe_load(ENTRIES_FILE.read_text())
SB3_N_STEPS = {"ppo": 2048, "trpo": 2048, "a2c": 5}  # SB3's defaults, for the rollout size of entries without n_steps
SAME_NAME = ("n_steps", "gamma", "gae_lambda", "n_epochs", "ent_coef", "clip_range", "max_grad_norm", "vf_coef",
             "train_freq", "gradient_steps", "tau", "learning_starts", "target_update_interval",
             "exploration_fraction", "exploration_final_eps", "normalize_advantage", "n_critic_updates", "use_sde",
             "sde_sample_freq", "batch_size", "noise_std", "top_quantiles_to_drop_per_net", "policy_delay")
NOISE_TYPES = {"normal": "gaussian", "ornstein-uhlenbeck": "ornstein_uhlenbeck", "none": "none"}
ACTIVATIONS = types.SimpleNamespace(ReLU="relu", Tanh="tanh", GELU="gelu", ELU="elu")


def policy_kwargs(text: str) -> dict[str, Any]:
    """RL-Zoo's "dict(log_std_init=-2, net_arch=[64, 64])" as a dict (evaluated with dict and nn only)."""
    return eval(text, {"__builtins__": {}, "dict": dict, "nn": ACTIVATIONS})  # noqa: S307 - our own stored data


def translate(algo: str, entry: dict[str, Any]) -> dict[str, Any]:
    """RL-Zoo keys -> the rlcli values they mean ({dotted key: value}); an unknown key fails the test."""
    on_policy = ALGOS.spec(algo).on_policy
    # the SB3 defaults an entry ran with where it is silent (an older SB3's); the entry's own keys win
    expected: dict[str, Any] = translate(algo, entry["sb3_defaults"]) if "sb3_defaults" in entry else {}
    for key, value in entry.items():
        if key in ("source", "sb3_defaults"):
            continue
        if key == "n_timesteps":
            expected["train.total_steps"] = int(value)
        elif key == "n_envs":
            expected["train.num_envs"] = value
        elif key == "policy":
            expected["actor.name"] = {"MlpPolicy": "mlp", "CnnPolicy": "cnn"}[value]
        elif key == "normalize":
            expected.update({"env.normalize_obs": value, "env.normalize_reward": value})
        elif key == "normalize_kwargs":
            expected.update({"env.normalize_obs": value["norm_obs"], "env.normalize_reward": value["norm_reward"]})
        elif key == "noise_type":
            expected["algo.noise"] = NOISE_TYPES[value]
        elif key == "train_freq":  # n steps, or [n, "episode"]
            every, unit = (value, "step") if isinstance(value, int) else (value[0], value[1])
            expected.update({"algo.train_freq": every, "algo.train_freq_unit": unit})
        elif key == "buffer_size":
            expected["buffer.capacity"] = value
        elif key == "use_rms_prop":
            expected["algo.optimizer"] = "rmsprop" if value else "adam"
        elif key == "learning_rate":
            if isinstance(value, str) and value.startswith("lin_") and on_policy:
                expected.update({"algo.lr": float(value[4:]), "algo.lr_schedule": "linear"})
            elif isinstance(value, str) and value.startswith("lin_"):  # off-policy: a schedule on every optimizer
                expected.update({"algo.lr": float(value[4:]), "algo.schedules.lr_scale": "linear:1:0"})
            else:
                expected["algo.lr"] = float(value)
        elif key == "batch_size" and on_policy:
            # SB3 trains on the whole rollout when the batch is larger than it; rlcli asks for that size
            rollout = entry.get("n_steps", SB3_N_STEPS[algo]) * entry.get("n_envs", 1)
            expected["algo.batch_size"] = min(value, rollout)
        elif key in SAME_NAME:
            expected[f"algo.{key}"] = value
        elif key == "policy_kwargs":
            for name, setting in policy_kwargs(value).items():
                rlcli_key = {"log_std_init": "actor.log_std_init", "ortho_init": "actor.ortho_init",
                             "net_arch": "actor.hidden_sizes", "activation_fn": "actor.activation",
                             "use_expln": "actor.use_expln", "full_std": "actor.full_std"}.get(name)
                if name == "net_arch" and algo == "crossq":  # sb3-contrib's CrossQ: a list is both networks'
                    expected["algo.critic_hidden_sizes"] = setting
                assert rlcli_key is not None, f"{algo}: unknown RL-Zoo policy_kwargs key {name!r}: translate it here"
                expected[rlcli_key] = setting
        else:
            pytest.fail(f"{algo}: unknown RL-Zoo key {key!r} (= {value!r}): translate it in this test and the file")
    return expected


def composed(algo: str, env: str) -> Any:
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return compose("config", overrides=[f"algo={algo}", f"env={env}"])


@pytest.mark.parametrize("name", list(ENTRIES))
def test_tuned_file_says_what_its_rl_zoo_entry_says(name):
    algo, env = name.split("/")
    tuned = Path(conf_dir()) / "tuned" / algo / f"{env}.yaml"
    assert tuned.exists(), f"no conf/tuned/{name}.yaml for the stored RL-Zoo entry"
    entry = ENTRIES[name]
    source = entry["source"].split()
    named = source[2] if source[:2] == ["model", "card"] else source[1].split("-v")[0]
    assert named in tuned.read_text(), \
        f"conf/tuned/{name}.yaml should name its source entry ({entry['source']})"
    cfg = composed(algo, env)
    wrong = []
    for key, value in translate(algo, entry).items():
        got = OmegaConf.select(cfg, key)
        got = OmegaConf.to_container(got) if OmegaConf.is_config(got) else got
        if isinstance(value, float) or isinstance(got, float):
            same = got is not None and abs(float(got) - float(value)) <= 1e-12 * max(1.0, abs(float(value)))
        else:
            same = got == value
        if not same:
            wrong.append(f"{key}: RL-Zoo {value!r}, rlcli {got!r}")
    assert not wrong, f"conf/tuned/{name}.yaml: " + "; ".join(wrong)


def test_an_unknown_rl_zoo_key_fails_the_walk():
    with pytest.raises(pytest.fail.Exception, match="unknown RL-Zoo key 'use_sde_at_warmup'"):
        translate("sac", {"use_sde_at_warmup": True})
