"""Reading a dataset from wherever people keep one: a `.npz` file, a D4RL-style HDF5 file, a local Minari dataset
(by directory or by id under the local Minari root, including ones Minari's own DataCollector wrote).

Every reader returns the same flat `Dataset` and runs `check_dataset` on it, so a bad file is one line naming the
field, never a shape error deep inside a training step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from rlcli.offline import _minari
from rlcli.offline.checks import check_dataset
from rlcli.offline.dataset import Dataset
from rlcli.registry import ConfigError

# the names each field goes by: ours (and Minari's / gymnasium's) first, then D4RL's
ALIASES = {
    "observations": ("observations", "obs"),
    "actions": ("actions",),
    "rewards": ("rewards",),
    "next_observations": ("next_observations", "next_obs"),
    "terminations": ("terminations", "terminals", "dones"),
    "truncations": ("truncations", "timeouts"),
}
FILE_SUFFIXES = (".npz", ".hdf5", ".h5")


def load_dataset(source: str | Path, download: bool = False) -> Dataset:
    """The dataset at `source`, checked (check_dataset).

    `source`: a `.npz` file (as save_npz writes it, or any with the usual keys), a D4RL-style `.hdf5` / `.h5` file
    (observations, actions, rewards, next_observations, terminals or terminations, timeouts or truncations), a
    Minari dataset directory, or a Minari dataset id under the local Minari root (MINARI_DATASETS_PATH, else
    ~/.minari/datasets). A file without next_observations (D4RL's raw files) gets them from the next row of the
    same episode; the last step of each truncated episode (a timeout, or the file's unfinished last episode) is
    dropped, since the observation after it was not recorded, and the step before it becomes the truncated one.
    `download=True` lets Minari fetch an id that is not local (a machine with network); without it, or when the
    fetch fails, that is one line. Raises ConfigError (one line) for anything that cannot be read.
    """
    text = str(source)
    path = Path(text).expanduser()
    if path.suffix.lower() in FILE_SUFFIXES or path.is_file():
        if not path.is_file():
            raise ConfigError(f"dataset file {text!r} does not exist"
                              f"{' (it is a directory)' if path.is_dir() else ''}")
        if path.suffix.lower() == ".npz":
            return read_npz(path)
        if path.suffix.lower() in (".hdf5", ".h5"):
            return read_hdf5(path)
        raise ConfigError(f"dataset file {text!r} is neither .npz nor .hdf5/.h5: rlcli reads those and Minari "
                          "dataset directories")
    data = _minari.is_dataset_dir(path) if path.is_dir() else None
    if data is not None:
        return read_minari(data)
    if path.is_dir():
        raise ConfigError(f"{text!r} is a directory but not a Minari dataset (no data/metadata.json in it)")
    where = _minari.root()
    data = _minari.is_dataset_dir(where / text) if _minari.ID_PATTERN.fullmatch(text) else None
    if data is not None:
        return read_minari(data)
    if download and _minari.ID_PATTERN.fullmatch(text):
        return _download(text, where)
    local = _minari.local_ids(where)
    have = f"it holds {len(local)}: {', '.join(local[:5])}{', ...' if len(local) > 5 else ''}" if local else \
        "it holds none"
    if not _minari.ID_PATTERN.fullmatch(text):
        raise ConfigError(f"dataset {text!r} is neither a .npz/.hdf5 file, a Minari dataset directory nor a Minari "
                          f"id (name-v<N>, e.g. pendulum/random-v0) in the local Minari root {where} ({have})")
    raise ConfigError(f"dataset {text!r} is not in the local Minari root {where} ({have}), and this machine cannot "
                      "download it (no network); make one with rl-dataset make, copy it there, set "
                      "MINARI_DATASETS_PATH, or on a machine with network fetch it first (rl-dataset info <id> "
                      "--download)")


def _download(dataset_id: str, where: Path) -> Dataset:
    """Minari's download of a remote id; any failure (no network, an unknown id) in one line."""
    minari = _minari.require_minari()
    try:
        minari.download_dataset(dataset_id)
    except Exception as error:  # network errors come from several libraries (urllib, google, huggingface)
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        raise ConfigError(f"dataset {dataset_id!r} is not in the local Minari root {where} and could not be "
                          f"downloaded ({type(error).__name__}: {first})") from None
    return read_minari(where / dataset_id / "data")


# ------------------------------------------------------------------------------------------------ arrays
def _pick(arrays: dict[str, Any], field: str) -> Any:
    for key in ALIASES[field]:
        if key in arrays:
            return arrays[key]
    return None


def from_arrays(arrays: dict[str, Any], name: str, env_id: str | None = None, ref_min_score: float | None = None,
                ref_max_score: float | None = None, metadata: dict[str, object] | None = None) -> Dataset:
    """A checked Dataset from arrays under our names or D4RL's; next_observations derived when missing (see
    load_dataset). Flags become bool, rewards float32, float actions and observations float32, int actions int64."""
    fields: dict[str, Any] = {}
    for field in ("observations", "actions", "rewards"):
        value = _pick(arrays, field)
        if value is None:
            raise ConfigError(f"dataset {name!r}: no {field} array (keys found: {', '.join(sorted(arrays)) or 'none'})")
        fields[field] = np.asarray(value)
    n = len(fields["rewards"]) if fields["rewards"].ndim else 0
    for field in ("terminations", "truncations"):
        value = _pick(arrays, field)
        if value is None and field == "terminations":
            raise ConfigError(f"dataset {name!r}: no terminations (or D4RL's terminals) array (keys found: "
                              f"{', '.join(sorted(arrays))})")
        fields[field] = np.zeros(n, dtype=bool) if value is None else np.asarray(value)
    next_obs = _pick(arrays, "next_observations")
    fields["next_observations"] = None if next_obs is None else np.asarray(next_obs)
    meta = dict(metadata or {})
    if fields["next_observations"] is None:
        # checked first with a stand-in, so that a bad flag or shape is named before the derivation uses it
        check_dataset(Dataset(**{**fields, "next_observations": fields["observations"]}, name=name))
        fields, dropped = _derive_next_observations(fields)
        meta["next_observations"] = f"derived from the next row; {dropped} truncated last step(s) dropped"
    raw = Dataset(**fields, env_id=env_id, ref_min_score=ref_min_score, ref_max_score=ref_max_score, name=name,
                  metadata=meta)
    check_dataset(raw)
    return check_dataset(normalized(raw))


def normalized(dataset: Dataset) -> Dataset:
    """The dtypes the algorithms take (see Dataset), converted only where they differ (a checked dataset)."""
    def as_type(array: np.ndarray, dtype: Any) -> np.ndarray:
        return array if array.dtype == dtype else array.astype(dtype)

    obs_dtype = np.float32 if dataset.observations.dtype.kind == "f" else dataset.observations.dtype
    actions = dataset.actions
    action_dtype = np.int64 if actions.dtype.kind in "iu" else np.float32
    dataset.observations = as_type(dataset.observations, obs_dtype)
    dataset.next_observations = as_type(dataset.next_observations, obs_dtype)
    dataset.actions = as_type(actions, action_dtype)
    dataset.rewards = as_type(dataset.rewards, np.float32)
    dataset.terminations = as_type(dataset.terminations, np.bool_)
    dataset.truncations = as_type(dataset.truncations, np.bool_)
    return dataset


def _derive_next_observations(fields: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """next_observations[i] = observations[i + 1] inside an episode; a terminated last step's next observation is
    never bootstrapped from (its own observation stands in); a truncated last step is dropped."""
    obs = fields["observations"]
    terminations = fields["terminations"].astype(bool)
    truncations = fields["truncations"].astype(bool)
    n = len(obs)
    next_obs = np.empty_like(obs)
    next_obs[:-1] = obs[1:]
    next_obs[-1] = obs[-1]
    next_obs[terminations] = obs[terminations]
    cut = truncations.copy()
    cut[-1] |= not terminations[-1]  # the file's last episode, unfinished: its next observation is unknown
    keep = ~cut
    # the step before a dropped one now ends its (truncated) episode
    before = np.flatnonzero(cut) - 1
    before = before[(before >= 0) & keep[np.maximum(before, 0)] & ~terminations[np.maximum(before, 0)]]
    truncations = np.zeros(n, dtype=bool)
    truncations[before] = True
    out = {k: np.asarray(v)[keep] for k, v in fields.items() if k != "next_observations"}
    out["truncations"] = truncations[keep]
    out["terminations"] = terminations[keep]
    out["next_observations"] = next_obs[keep]
    return out, int(cut.sum())


# ------------------------------------------------------------------------------------------------ files
def _scalar(value: Any) -> Any:
    """A 0-d array (as np.savez stores a Python value) as the value; "" and NaN (our "none") as None."""
    item = np.asarray(value).item() if np.ndim(value) == 0 else value
    if isinstance(item, bytes):
        item = item.decode()
    if item == "" or (isinstance(item, float) and np.isnan(item)):
        return None
    return item


def read_npz(path: Path) -> Dataset:
    """A .npz file: save_npz's, or any with the usual keys (D4RL's names work too). No pickles are read."""
    try:
        with np.load(path, allow_pickle=False) as file:
            arrays = {key: file[key] for key in file.files}
    except ValueError as error:  # an object array (a pickle) inside
        raise ConfigError(f"dataset file {str(path)!r} holds pickled objects, which rlcli does not read ({error})") \
            from None
    except (OSError, EOFError) as error:
        raise ConfigError(f"dataset file {str(path)!r} is not a readable .npz file ({error})") from None
    meta: dict[str, object] = {}
    if "metadata" in arrays:
        try:
            meta = json.loads(str(_scalar(arrays.pop("metadata")) or "{}"))
        except json.JSONDecodeError:
            meta = {}
    env_id, low, high = (_scalar(arrays.pop(k)) if k in arrays else None
                         for k in ("env_id", "ref_min_score", "ref_max_score"))
    name = _scalar(arrays.pop("name")) if "name" in arrays else None
    return from_arrays(arrays, str(name or path.name), env_id=env_id, ref_min_score=_float(low),
                       ref_max_score=_float(high), metadata=meta)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def read_hdf5(path: Path) -> Dataset:
    """A D4RL-style HDF5 file: top-level datasets under the usual keys; env id and reference scores from the
    file's attributes when it has them (env_id / env_name, ref_min_score, ref_max_score)."""
    try:
        import h5py
    except ImportError:
        raise ConfigError(f"reading {str(path)!r} needs h5py, which is not installed: {_minari.INSTALL}") from None
    try:
        with h5py.File(path, "r") as file:
            arrays = {key: file[key][()] for key in file if isinstance(file[key], h5py.Dataset)}
            attrs = {key: _scalar(value) for key, value in file.attrs.items()}
    except OSError as error:
        raise ConfigError(f"dataset file {str(path)!r} is not a readable HDF5 file ({error})") from None
    env_id = attrs.get("env_id") or attrs.get("env_name")
    return from_arrays(arrays, path.name, env_id=None if env_id is None else str(env_id),
                       ref_min_score=_float(attrs.get("ref_min_score")),
                       ref_max_score=_float(attrs.get("ref_max_score")))


# ------------------------------------------------------------------------------------------------ Minari
def read_minari(data_path: Path) -> Dataset:
    """A local Minari dataset (its data/ directory): episodes flattened into transitions, observations[t + 1] of an
    episode becoming next_observations[t]. Box or Discrete observations and actions only (the flat arrays hold
    nothing else)."""
    minari = _minari.require_minari()
    name = str(data_path.parent.name)
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            found = minari.MinariDataset(data_path)
    except Exception as error:  # a version Minari refuses, a damaged file
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        raise ConfigError(f"Minari dataset at {str(data_path.parent)!r} cannot be read ({first})") from None
    name = str(found.id)
    import gymnasium

    for what, space in (("observation", found.observation_space), ("action", found.action_space)):
        if not isinstance(space, gymnasium.spaces.Box | gymnasium.spaces.Discrete):
            raise ConfigError(f"dataset {name!r}: its {what} space is {space}; rlcli's datasets hold Box or Discrete "
                              f"{what}s (flatten it first, e.g. with gymnasium's FlattenObservation)")
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ALIASES}
    for episode in found.iterate_episodes():
        obs = np.asarray(episode.observations)
        steps = len(episode.rewards)
        if steps == 0:
            continue
        parts["observations"].append(obs[:steps])
        parts["next_observations"].append(obs[1:steps + 1])
        parts["actions"].append(np.asarray(episode.actions)[:steps])
        parts["rewards"].append(np.asarray(episode.rewards))
        parts["terminations"].append(np.asarray(episode.terminations))
        parts["truncations"].append(np.asarray(episode.truncations))
    if not parts["rewards"]:
        raise ConfigError(f"dataset {name!r}: rewards is empty (0 transitions), expected at least one transition")
    arrays = {k: np.concatenate(v) for k, v in parts.items()}
    metadata = found.storage.metadata
    env_spec = found.env_spec
    ours = metadata.get("rlcli")
    return from_arrays(arrays, name, env_id=None if env_spec is None else str(env_spec.id),
                       ref_min_score=_float(metadata.get("ref_min_score")),
                       ref_max_score=_float(metadata.get("ref_max_score")),
                       metadata=dict(ours) if isinstance(ours, dict) else {})
