"""Writing a dataset: in Minari's format (through minari's own API, so `minari.load_dataset` reads it) or as one
`.npz` file. Both round-trip through `load_dataset` bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from rlcli.offline import _minari
from rlcli.offline.checks import check_dataset, discrete_actions
from rlcli.offline.dataset import Dataset
from rlcli.registry import ConfigError


def _json_metadata(dataset: Dataset) -> dict[str, Any]:
    """The dataset's metadata as JSON takes it (numpy scalars and paths become plain values)."""
    plain: dict[str, Any] = json.loads(json.dumps(dataset.metadata,
                                                  default=lambda v: v.item() if hasattr(v, "item") else str(v)))
    return plain


def save_npz(dataset: Dataset, path: str | Path, overwrite: bool = False) -> Path:
    """One compressed .npz: the six arrays plus env_id, reference scores, name and metadata (JSON) as scalars, so
    that it loads without pickles."""
    check_dataset(dataset)
    target = Path(path).expanduser()
    if target.suffix != ".npz":
        raise ConfigError(f"{str(target)!r}: an .npz dataset's file name ends in .npz")
    if target.exists() and not overwrite:
        raise ConfigError(f"{str(target)!r} exists already; choose another name or pass --overwrite")
    target.parent.mkdir(parents=True, exist_ok=True)
    nan = float("nan")
    tmp = target.with_name(target.name + ".tmp.npz")
    np.savez_compressed(
        tmp, observations=dataset.observations, actions=dataset.actions, rewards=dataset.rewards,
        next_observations=dataset.next_observations, terminations=dataset.terminations,
        truncations=dataset.truncations, env_id=np.str_(dataset.env_id or ""),
        ref_min_score=np.float64(nan if dataset.ref_min_score is None else dataset.ref_min_score),
        ref_max_score=np.float64(nan if dataset.ref_max_score is None else dataset.ref_max_score),
        name=np.str_(dataset.name), metadata=np.str_(json.dumps(_json_metadata(dataset))))
    tmp.replace(target)  # a stopped write leaves no half file under the real name
    return target


def _spaces(dataset: Dataset) -> tuple[Any, Any]:
    """Observation and action spaces for a dataset whose env is unknown (a bare .npz): unbounded Boxes of its
    shapes and dtypes, and Discrete(max + 1) for integer actions."""
    import gymnasium

    obs = dataset.observations
    observation_space = gymnasium.spaces.Box(-np.inf, np.inf, obs.shape[1:], obs.dtype) if obs.dtype.kind == "f" \
        else gymnasium.spaces.Box(np.iinfo(obs.dtype).min, np.iinfo(obs.dtype).max, obs.shape[1:], obs.dtype)
    if discrete_actions(dataset):
        return observation_space, gymnasium.spaces.Discrete(int(dataset.actions.max()) + 1)
    return observation_space, gymnasium.spaces.Box(-np.inf, np.inf, dataset.actions.shape[1:], dataset.actions.dtype)


def episodes_of(dataset: Dataset) -> list[dict[str, Any]]:
    """Minari's episode buffers: each episode's observations once, plus the last next observation. Refused in one
    line where an episode is not one chain (next_observations[i] != observations[i + 1] inside it), since Minari
    cannot hold that without changing the data."""
    ends = dataset.episode_ends
    starts = np.concatenate([[0], ends[:-1] + 1])
    obs, next_obs = dataset.observations, dataset.next_observations
    inside = np.ones(len(dataset), dtype=bool)
    inside[ends] = False
    chained = np.all((next_obs[:-1] == obs[1:]).reshape(len(dataset) - 1, -1), axis=1) if len(dataset) > 1 else \
        np.zeros(0, dtype=bool)
    broken = np.flatnonzero(inside[:-1] & ~chained)
    if broken.size:
        i = int(broken[0])
        raise ConfigError(f"dataset {dataset.name!r}: next_observations at row {i} differs from observations at row "
                          f"{i + 1} inside one episode ({broken.size} rows), expected one chain per episode: Minari "
                          "stores an episode's observations once; save it as .npz instead")
    return [{"observations": np.concatenate([obs[s:e + 1], next_obs[e:e + 1]]), "actions": dataset.actions[s:e + 1],
             "rewards": dataset.rewards[s:e + 1], "terminations": dataset.terminations[s:e + 1],
             "truncations": dataset.truncations[s:e + 1]} for s, e in zip(starts, ends, strict=True)]


def save_minari(dataset: Dataset, dataset_id: str, root: str | Path | None = None, overwrite: bool = False) -> Path:
    """Write `dataset` as the Minari dataset `dataset_id` (name-v<N>, optionally namespace/name-v<N>) under the local
    Minari root (`root`, else MINARI_DATASETS_PATH, else ~/.minari/datasets), with minari's
    create_dataset_from_buffers: its env spec (when the env id is a registered one), the reference scores
    (`ref_min_score` / `ref_max_score` of its metadata) and our metadata under "rlcli". Images are stored raw, not
    JPEG, so the arrays read back bit-identical. Returns the dataset's directory."""
    check_dataset(dataset)
    if not _minari.ID_PATTERN.fullmatch(dataset_id):
        raise ConfigError(f"Minari dataset id {dataset_id!r} is invalid: Minari's ids are (namespace/)name-v<N>, "
                          "e.g. pendulum/random-v0")
    minari = _minari.require_minari()
    import gymnasium
    from minari.data_collector.episode_buffer import EpisodeBuffer

    where = _minari.root(root)
    target = where / dataset_id
    if target.exists():
        if not overwrite:
            raise ConfigError(f"Minari dataset {dataset_id!r} exists already in {where}; choose another id (or "
                              "version) or pass --overwrite")
        shutil.rmtree(target)
    buffers = [EpisodeBuffer(id=i, **episode) for i, episode in enumerate(episodes_of(dataset))]
    env: Any = None
    if dataset.env_id is not None:
        try:
            env = gymnasium.spec(dataset.env_id)
        except gymnasium.error.Error:
            env = None  # not registered in this process: the spaces alone
    if env is not None:  # the kwargs and time limit the data was recorded with, so recover_environment rebuilds it
        kwargs, limit = dataset.metadata.get("env_kwargs"), dataset.metadata.get("max_episode_steps")
        if isinstance(kwargs, dict) and kwargs:
            env = dataclasses.replace(env, kwargs={**env.kwargs, **kwargs})
        if isinstance(limit, int):
            env = dataclasses.replace(env, max_episode_steps=limit)
    observation_space, action_space = (None, None) if env is not None else _spaces(dataset)
    if env is None and dataset.env_id is not None:
        warnings.warn(f"env {dataset.env_id} is not registered here: the Minari dataset gets no env spec", stacklevel=2)
    both = dataset.ref_min_score is not None and dataset.ref_max_score is not None
    metadata = _json_metadata(dataset)
    if dataset.env_id is not None:
        metadata.setdefault("env_id", dataset.env_id)
    where.mkdir(parents=True, exist_ok=True)
    try:
        with _minari.using_root(where), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its eval_env / missing-author notices
            written = minari.create_dataset_from_buffers(
                dataset_id, buffers, env=env, eval_env=env, algorithm_name=str(metadata.get("source", "rlcli")),
                observation_space=observation_space, action_space=action_space,
                # both or neither: given one alone Minari drops ref_min_score, or rolls out 100 random episodes
                ref_min_score=dataset.ref_min_score if both else None,
                ref_max_score=dataset.ref_max_score if both else None,
                description=f"made by rlcli (rl-dataset): {metadata.get('source', dataset.name)}",
                jpeg_encoding=False)
            extra: dict[str, Any] = {"rlcli": metadata}
            if not both:
                extra.update({k: v for k, v in (("ref_min_score", dataset.ref_min_score),
                                                ("ref_max_score", dataset.ref_max_score)) if v is not None})
            written.storage.update_metadata(extra)
    except (ValueError, TypeError) as error:
        shutil.rmtree(target, ignore_errors=True)
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        raise ConfigError(f"Minari could not write dataset {dataset_id!r} ({first})") from None
    return target
