"""A run with `dataset=`: the dataset read once, its env chosen, its settings checked, its fingerprint for resume.

An offline run is an ordinary run whose replay storage the dataset filled (offline/replay.py) and whose collector
touches no env (collectors/offline.py): the loop, the update, the test phases and the checkpoints are the same.
Nothing here imports torch, so a bad dataset or setting is one line before torch is imported (rl_train.py's early
path reads the dataset's env id from here).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from rlcli.offline.dataset import Dataset
from rlcli.registry import ConfigError, require

MAKE_ONE = "make one with rl-dataset make ... (docs/guide/datasets.md)"


@dataclass
class OfflineSettings:
    """The `offline:` config section (see conf/config.yaml)."""

    normalize_obs: bool = False
    reward_scale: Literal["none", "returns"] = "none"
    reward_factor: float = 1.0
    online_steps: int = 0
    offline_fraction: float | None = 0.5
    offline_fraction_final: float | None = None

    def __post_init__(self) -> None:
        require(isinstance(self.normalize_obs, bool), "offline.normalize_obs", self.normalize_obs,
                "expected true or false")
        require(self.reward_scale in ("none", "returns"), "offline.reward_scale", self.reward_scale,
                "choose from: none, returns (x 1000 / (max - min episode return), as IQL)")
        factor = self.reward_factor
        require(isinstance(factor, (int, float)) and not isinstance(factor, bool) and np.isfinite(factor)
                and factor > 0, "offline.reward_factor", factor, "must be a finite number > 0")
        steps = self.online_steps
        require(isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0, "offline.online_steps", steps,
                "must be an integer >= 0 (env steps after the offline budget; 0: none)")
        share = self.offline_fraction
        require(share is None or (isinstance(share, (int, float)) and not isinstance(share, bool)
                                  and 0.0 <= share <= 1.0), "offline.offline_fraction", share,
                "must be in [0, 1] (the dataset's share of each batch once online), or null (uniform)")
        final = self.offline_fraction_final
        require(final is None or (isinstance(final, (int, float)) and not isinstance(final, bool)
                                  and 0.0 <= final <= 1.0), "offline.offline_fraction_final", final,
                "must be in [0, 1] (the share reached at the end of the online steps), or null (no annealing)")
        require(final is None or share is not None, "offline.offline_fraction_final", final,
                "anneals offline.offline_fraction, which is null (uniform sampling): set offline.offline_fraction "
                "too, or leave this null")


@dataclass
class OfflineData:
    """The dataset a run learns from, where it came from, and what identifies its contents."""

    source: str  # as given in dataset=
    dataset: Dataset
    fingerprint: dict[str, Any]
    settings: OfflineSettings

    def describe(self) -> str:
        return f"dataset {self.dataset.name} ({len(self.dataset):,} transitions)"


# source -> dataset, so that the early env-id look (rl_train.py) and the build read a file once per process
_READ: dict[str, Dataset] = {}


def dataset_source(cfg: Any) -> str | None:
    """The `dataset=` value as a string, or None for an ordinary run (a one-line error for a non-path value)."""
    value = cfg.get("dataset") if hasattr(cfg, "get") else None
    if value is None:
        return None
    require(isinstance(value, str) and value.strip() != "", "dataset", value,
            "give a dataset's path (.npz, .hdf5, a Minari dataset directory) or a Minari id")
    return str(value)


def settings_of(cfg: Any) -> OfflineSettings:
    """The `offline:` section, checked (unknown keys and bad values in one line)."""
    from omegaconf import OmegaConf

    from rlcli.registry import check_kwargs

    node = cfg.get("offline")
    given = OmegaConf.to_container(node, resolve=True) if node is not None else {}
    given = given if isinstance(given, dict) else {}
    check_kwargs(OfflineSettings, given, prefix="offline")
    return OfflineSettings(**{str(k): v for k, v in given.items()})


def check_early(cfg: Any) -> None:
    """What rl-train checks of an offline run before torch is imported: the dataset reads, its settings, its env."""
    source = dataset_source(cfg)
    if source is None:
        return
    settings_of(cfg)
    check_env_settings(cfg)
    check_env(read(source), source, str(cfg.env.id))


def check_env_settings(cfg: Any) -> None:
    """The env's running normalizations gather statistics from training envs, which an offline run does not step:
    the dataset's own statistics are offline.normalize_obs and offline.reward_scale."""
    env = cfg.get("env") or {}
    if env.get("normalize_obs", False) is True:
        raise ConfigError("env.normalize_obs=true keeps running statistics of the training envs, which an offline run "
                          "does not step: use offline.normalize_obs=true (the dataset's mean and std)")
    if env.get("normalize_reward", False) is True:
        raise ConfigError("env.normalize_reward=true scales by running statistics of the training envs' returns, which "
                          "an offline run does not step: use offline.reward_scale=returns or offline.reward_factor")


def read(source: str) -> Dataset:
    """The dataset at `source` (offline/load.py's readers), read once per process; ConfigError in one line."""
    if source not in _READ:
        _READ[source] = _load(source)
    return _READ[source]


def forget(source: str | None = None) -> None:
    """Drop the read datasets (all, or one): a resume after the file changed must read it again."""
    if source is None:
        _READ.clear()
    else:
        _READ.pop(source, None)


def _load(source: str) -> Dataset:
    from rlcli.offline.load import load_dataset

    try:
        return load_dataset(source)
    except ConfigError as error:
        if Path(source).expanduser().exists() or "rl-dataset" in str(error):
            raise
        raise ConfigError(f"{error}; {MAKE_ONE}") from None


def fingerprint(dataset: Dataset) -> dict[str, Any]:
    """Its size and a hash of every array's bytes, shape and dtype: a checkpoint keeps this, not the data."""
    digest = hashlib.blake2b(digest_size=16)
    for name in ("observations", "actions", "rewards", "next_observations", "terminations", "truncations"):
        array = np.ascontiguousarray(getattr(dataset, name))
        digest.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
        digest.update(memoryview(array).cast("B"))
    return {"transitions": len(dataset), "blake2b": digest.hexdigest()}


def check_fingerprint(saved: dict[str, Any], data: OfflineData, checkpoint_name: str) -> None:
    """A resume learns from the very dataset the checkpoint did, or is refused in one line."""
    now = data.fingerprint
    if saved == now:
        return
    size = (f"{saved.get('transitions', '?'):,} -> {now['transitions']:,} transitions"
            if saved.get("transitions") != now["transitions"] else "the same size, other contents")
    raise ConfigError(f"cannot resume {checkpoint_name}: dataset={data.source!r} changed since it was saved ({size}); "
                      "resume needs the dataset it trained on (or start a new run on this one)")


def env_choice(dataset: Dataset, source: str, conf_dir: str) -> list[str]:
    """The env overrides a run on `dataset` gets when the command line names no env: conf/env/<id>.yaml when it
    exists, else env=gym env.id=<id>. A dataset that names no env needs env= typed."""
    env_id = dataset.env_id
    if not env_id:
        raise ConfigError(f"dataset={source!r} does not say which env it was recorded on: give env=<the env's "
                          "config or gymnasium id> (or env=gym env.id=<id>) to test it in")
    if (Path(conf_dir) / "env" / f"{env_id}.yaml").is_file():
        return [f"env={env_id}"]
    return ["env=gym", f"env.id={env_id}"]


def check_env(dataset: Dataset, source: str, env_id: str) -> None:
    """A typed env must be the env the dataset was recorded on (its test phases would measure another task)."""
    if dataset.env_id and dataset.env_id != env_id:
        raise ConfigError(f"dataset={source!r} was recorded on env {dataset.env_id}, not env.id={env_id}: drop env= "
                          f"(the dataset's env is used) or give env={dataset.env_id}")


def reward_multiplier(dataset: Dataset, settings: OfflineSettings) -> float:
    """What the dataset's rewards are multiplied by: IQL's 1000 / (max - min episode return) for returns, then the
    plain factor."""
    factor = float(settings.reward_factor)
    if settings.reward_scale == "returns":
        ends = dataset.episode_ends
        sums = np.add.reduceat(dataset.rewards.astype(np.float64), np.r_[0, ends[:-1] + 1])
        spread = float(sums.max() - sums.min()) if len(sums) else 0.0
        if spread <= 0.0:
            raise ConfigError(f"offline.reward_scale=returns needs episodes of different returns; dataset "
                              f"{dataset.name!r} has {len(sums)} episode(s) all returning {float(sums[0]):g}: use "
                              "offline.reward_scale=none")
        factor *= 1000.0 / spread
    return factor


def observation_moments(dataset: Dataset) -> tuple[np.ndarray, np.ndarray]:
    """The dataset's observation mean and variance (float64), what offline.normalize_obs freezes into the networks."""
    obs = dataset.observations.reshape(len(dataset), -1).astype(np.float64)
    shape = dataset.observations.shape[1:]
    return obs.mean(0).reshape(shape), obs.var(0).reshape(shape)
