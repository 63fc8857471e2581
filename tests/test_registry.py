"""Registry look-ups and config checks produce one-line errors that name the value and the choices."""

from pathlib import Path
from typing import Literal

import pytest

from rlcli.registry import ConfigError, Registry, check_kwargs


def make_registry():
    reg = Registry("algo")

    @reg.register("ppo")
    def ppo(actor, lr: float = 3e-4, n_epochs: int = 10, schedule: Literal["constant", "linear"] = "constant",
            sizes: list[int] = (64,), target_kl: float | None = None, flag: bool = True):
        return {"actor": actor, "lr": lr, "n_epochs": n_epochs}

    @reg.register("a2c")
    def a2c(actor):
        return "a2c"

    return reg


def one_line(excinfo) -> str:
    text = str(excinfo.value)
    assert "\n" not in text
    return text


def test_build_passes_config_and_context():
    reg = make_registry()
    assert reg.build({"name": "ppo", "lr": 1e-3}, actor="net") == {"actor": "net", "lr": 1e-3, "n_epochs": 10}
    assert reg.names() == ["a2c", "ppo"]


def test_unknown_name_lists_choices_and_closest_match():
    with pytest.raises(ConfigError) as e:
        make_registry().build({"name": "ppo2"}, actor=None)
    assert one_line(e) == "unknown algo 'ppo2' (did you mean 'ppo'?); choose from: a2c, ppo"


def test_unknown_key_names_full_key_and_closest_match():
    with pytest.raises(ConfigError) as e:
        make_registry().build({"name": "ppo", "lrr": 1e-3}, actor=None)
    msg = one_line(e)
    assert msg.startswith("unknown key 'algo.lrr' (did you mean 'algo.lr'?); valid keys: ")
    assert "n_epochs" in msg and "actor" not in msg  # context arguments are not config keys


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("lr", "abc", "algo.lr='abc' is invalid: expected a number"),
        ("n_epochs", 2.5, "algo.n_epochs=2.5 is invalid: expected an integer"),
        ("n_epochs", True, "algo.n_epochs=True is invalid: expected an integer"),
        ("schedule", "cosine", "algo.schedule='cosine' is invalid: choose from: constant, linear"),
        ("sizes", [64, "x"], "algo.sizes=[64, 'x'] is invalid: list item 'x': expected an integer"),
        ("target_kl", "big", "algo.target_kl='big' is invalid: expected a number or expected null"),
        ("flag", "yes", "algo.flag='yes' is invalid: expected true or false"),
    ],
)
def test_wrong_types_are_one_line_errors(key, value, expected):
    with pytest.raises(ConfigError) as e:
        make_registry().build({"name": "ppo", key: value}, actor=None)
    assert one_line(e) == expected


def test_valid_values_pass_including_int_for_float_and_null_for_optional():
    reg = make_registry()
    out = reg.build({"name": "ppo", "lr": 1, "target_kl": None, "sizes": [32, 32]}, actor=None)
    assert out["lr"] == 1


def test_missing_required_key_and_missing_name():
    def needs(x: int):
        return x

    with pytest.raises(ConfigError, match="missing required key"):
        check_kwargs(needs, {}, prefix="buffer")
    with pytest.raises(ConfigError, match="no 'name:' key"):
        make_registry().build({}, actor=None)


def test_plugins_register_through_entry_points(monkeypatch):
    reg = Registry("algo")

    class FakeEntryPoint:
        name = "my_algo"

        def load(self):
            return lambda actor: "plugged in"

    fake = lambda group: [FakeEntryPoint()] if group == "rlcli.algos" else []  # noqa: E731
    monkeypatch.setattr("rlcli.registry.entry_points", fake)
    assert reg.build({"name": "my_algo"}, actor=None) == "plugged in"
    assert "my_algo" in reg.names()


def _shipped_algo_settings(name):
    """conf/algo/<name>.yaml's algo keys (a file in the global package keeps them under `algo:`)."""
    from omegaconf import OmegaConf

    from rlcli.run.compose import conf_dir

    raw = OmegaConf.to_container(OmegaConf.load(Path(conf_dir()) / "algo" / f"{name}.yaml"))
    return raw.get("algo", raw)


def test_every_algorithm_default_is_written_once_the_yaml_agrees_with_the_constructor():
    """The constructor's typed keywords are the schema; a key the yaml also states (for its comment, and for
    `--cfg job`) must say the same value, so that Python and the CLI cannot build different algorithms."""
    from rlcli.registry import ALGOS, _accepted_parameters
    from rlcli.run.build import ALGO_CONTEXT

    disagreements = []
    for name in ALGOS.names():
        params, _ = _accepted_parameters(ALGOS.get(name), ALGO_CONTEXT)
        for key, value in _shipped_algo_settings(name).items():
            if key in ("name", "schedules", "policy_loss_addons"):  # the trainer's, not the constructor's
                continue
            assert key in params, f"conf/algo/{name}.yaml sets {key}, which algo={name}'s constructor does not take"
            default = params[key].default
            same = default == value or (isinstance(default, tuple) and list(default) == value)
            if not same:
                disagreements.append(f"{name}.{key}: constructor {default!r}, yaml {value!r}")
    assert not disagreements, disagreements
