"""A run's state in a checkpoint: capture it from the components, restore them from it.

One checkpoint holds everything needed to continue as if never stopped: the config, the trainer's
counters, the algorithm (networks, targets, optimizers, its own counters), the storage, the
collector's current observations and carry, the env states and every RNG.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from rlcli.registry import ConfigError, as_typed
from rlcli.run.build import Components, build
from rlcli.run.resume import change_record, check_compatible, differences, new_settings_kept
from rlcli.services import checkpoint

# What the payload holds; a checkpoint from an rlcli with another layout is refused in one line.
PAYLOAD_VERSION = 2


@dataclass
class TrainState:
    """Every counter of a run; saved whole in checkpoints."""

    env_steps: int = 0
    updates: int = 0
    episodes: int = 0
    tests: int = 0
    last_test_return: float | None = None
    best_test_return: float | None = None
    train_seconds: float = 0.0  # wall time spent in training, summed over resumes
    finished: bool = False  # the budget or the stop reward was reached
    tracking: dict[str, str] = dataclasses.field(default_factory=dict)  # sink -> its run id (MLflow, W&B)
    stale_best: bool = False  # resumed before a best.pt that the stopped run wrote later: remove it at a save
    # the resumes that changed settings on request (resume.change_record), oldest first: the run's history of
    # where it stopped being an exact continuation
    changes: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    new_change: dict[str, Any] | None = None  # this process's own such resume, for the trainer to announce


TRANSIENT = ("stale_best", "new_change")  # concern this process only: not kept in checkpoints


def counters(state: TrainState) -> dict[str, Any]:
    """The counters a checkpoint keeps (`stale_best` concerns this process only)."""
    kept = {k: v for k, v in dataclasses.asdict(state).items() if k not in TRANSIENT}
    if not kept["changes"]:  # an exact run's checkpoint stays as before (an older rlcli reads it)
        del kept["changes"]
    return kept


def capture(c: Components, state: TrainState) -> dict[str, Any]:
    """The checkpoint payload of a run at a safe point (between iterations)."""
    return {
        "payload_version": PAYLOAD_VERSION,
        "config": OmegaConf.to_container(c.cfg, resolve=True),
        "state": counters(state),
        "algo": c.algo.state_dict(),
        "buffer": stored_buffer(c),
        "rng": checkpoint.rng_state(),
        "collector": c.collector.state_dict(),
        "envs": c.collector.env_state(),
        "recent": {"returns": list(c.recent_returns), "lengths": list(c.recent_lengths)},
    }


def stored_buffer(c: Components) -> dict[str, Any]:
    """The storage's state; for a run with `dataset=`, only where the dataset came from and its fingerprint (the
    storage holds nothing else, and a dataset may be gigabytes): a resume reads it again and checks it."""
    if c.offline is not None:
        stored: dict[str, Any] = {"dataset": {"source": c.offline.source, **c.offline.fingerprint}}
        if c.offline.settings.online_steps:  # offline.online_steps: the online rows after the dataset's
            stored["online"] = c.buffer.state_dict()
        return stored
    return c.buffer.state_dict()


def restore_buffer(c: Components, stored: dict[str, Any], path: Path) -> None:
    """Put the storage back: an offline run's was filled from the dataset at build, which must be the same one."""
    saved = stored.get("dataset") if isinstance(stored, dict) else None
    if c.offline is None:
        if saved is not None:
            raise checkpoint.CheckpointError(f"{path} is an offline run's (dataset={saved.get('source')!r}): resume "
                                             "it with its dataset")
        c.buffer.load_state_dict(stored)
        return
    if saved is None:
        raise checkpoint.CheckpointError(f"{path} holds an online run's replay, not dataset={c.offline.source!r}'s")
    from rlcli.run.offline import check_fingerprint

    check_fingerprint({k: v for k, v in saved.items() if k != "source"}, c.offline, path.name)
    if "online" in stored:
        c.buffer.load_state_dict(stored["online"])


BEST = "best.pt"


def _require_run_dir(run_dir: Path) -> None:
    """A run dir deleted or moved while training is not made again holding checkpoints only (a best.pt alone would
    look like a run that kept its checkpoints): the write fails as the other files' writes do."""
    if not run_dir.is_dir():
        raise FileNotFoundError(2, "No such file or directory", str(run_dir))


def save_best(c: Components, state: TrainState, run_dir: Path) -> Path:
    """`checkpoints/best.pt`: the networks (with their observation statistics) and config of the best test
    phase so far; enough to evaluate, watch or export the agent, not to resume it. Never pruned."""
    payload = {"payload_version": PAYLOAD_VERSION, "config": OmegaConf.to_container(c.cfg, resolve=True),
               "state": counters(state), "algo": {"networks": c.algo.networks.state_dict()}}
    _require_run_dir(run_dir)
    return checkpoint.write(run_dir / "checkpoints" / BEST, state.env_steps, payload)


def save(c: Components, state: TrainState, run_dir: Path) -> Path:
    _require_run_dir(run_dir)
    return checkpoint.save(run_dir / "checkpoints", state.env_steps, capture(c, state),
                           keep=c.settings.keep_checkpoints)


def restore(c: Components, path: Path) -> TrainState:
    """Load the checkpoint at `path` into the components; return the run's counters."""
    data = checkpoint.load(path, map_location=c.device)
    checkpoint.require(data, path, "config", "state", "algo", "buffer", "rng", "collector", "envs", "recent")
    version = data.get("payload_version", 1)
    if version != PAYLOAD_VERSION:
        raise checkpoint.CheckpointError(
            f"{path} holds a layout-{version} checkpoint from an older rlcli; this rlcli resumes layout "
            f"{PAYLOAD_VERSION} only (its networks can still warm-start a new run: actor.init_from={path})")
    changes = check_compatible(data["config"], OmegaConf.to_container(c.cfg, resolve=True),  # type: ignore[arg-type]
                               path, c.algo)
    with new_settings_kept(c.algo, changes):  # a resume that changes algo.lr on request: the new lr, not the saved
        c.algo.load_state_dict(data["algo"])
    restore_buffer(c, data["buffer"], path)
    state = TrainState(**data["state"])
    if changes:
        state.new_change = change_record(changes, state.env_steps, path.name)
        state.changes = [*state.changes, state.new_change]
    c.recent_returns.extend(data["recent"]["returns"])
    c.recent_lengths.extend(data["recent"]["lengths"])
    c.collector.load_state_dict(data["collector"])
    why_not = c.collector.restore_envs(data["envs"])
    if why_not is not None:
        c.collector.reset(seed=int(c.cfg.seed) + state.updates)
        if callable(envs_reset := getattr(c.learner.buffer, "envs_reset", None)):  # what a replay was gathering
            envs_reset(list(range(c.settings.num_envs)))
        c.notices.append(why_not)
    checkpoint.set_rng_state(data["rng"])
    state.stale_best = _best_is_later(path.parent / BEST, state.env_steps)
    return state


def _best_is_later(best: Path, env_steps: int) -> bool:
    """A best model that the stopped process wrote after this checkpoint is dropped, as its TensorBoard points
    are: the resumed run writes it again when it gets there (so best.pt always belongs to this run's history).
    It is only marked here; the trainer removes it after its first checkpoint is safely written, so a resume
    that fails (no space, a crash) leaves it in place."""
    if not best.is_file():
        return False
    try:
        return int(checkpoint.load(best)["env_steps"]) > env_steps
    except checkpoint.CheckpointError:
        return True  # unreadable: the next better test phase writes a good one


def drop_stale_best(state: TrainState, run_dir: Path) -> None:
    """Remove the later best.pt that `restore` marked (a better test phase since has overwritten it, or not)."""
    if state.stale_best:
        (run_dir / "checkpoints" / BEST).unlink(missing_ok=True)
        state.stale_best = False


def initial_state(c: Components) -> TrainState:
    """A fresh run's counters, or the checkpoint's when the config says `resume=<checkpoint>`."""
    resume = c.cfg.get("resume")
    return restore(c, Path(str(resume))) if resume else TrainState()


def refuse_changed_env(cfg: Any, path: Path) -> None:
    """`rl-train resume=<run> env.groups=null`: the build's own check named what the new value lacks (set
    env.groups); the env cannot change on resume at all, which is the line to give."""
    try:
        saved = checkpoint.load(path)["config"]
    except (checkpoint.CheckpointError, KeyError):
        return
    current = OmegaConf.to_container(cfg, resolve=True)
    changed = [(key, old, new) for key, old, new in differences(saved, current) if key.startswith("env.")]  # type: ignore[arg-type]
    if changed:
        listed = ", ".join(f"{key} ({as_typed(old)} -> {as_typed(new)})" for key, old, new in changed)
        raise ConfigError(f"cannot resume {path.name} with a changed {listed}: the env a run trains on cannot change "
                          "on resume (start a new run for another)")


def prepare(cfg: Any, start_workers: bool = True) -> tuple[Components, TrainState]:
    """Build a run's components and load its checkpoint when it resumes (the components are closed again if
    the checkpoint does not fit)."""
    try:
        components = build(cfg, start_workers)
    except ConfigError:
        if cfg.get("resume"):  # a check that failed because the resume changed the env: say that instead
            refuse_changed_env(cfg, Path(str(cfg.resume)))
        raise
    try:
        return components, initial_state(components)
    except BaseException:
        components.close()
        raise
