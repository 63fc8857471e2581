"""Making datasets: a trained run's policy rolled out in its env (deterministic, stochastic, or with Gaussian /
epsilon noise), a uniform random policy, a run's whole replay buffer (D4RL's "medium-replay" kind), and several
datasets concatenated ("medium-expert"); plus the reference scores that make normalized scores possible.

Rollouts step one plain gymnasium env (not rlcli's vector envs), so the dataset holds the env's own observations
and actions, as Minari's datasets do, and its env id alone rebuilds the env.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlcli.offline.checks import check_dataset
from rlcli.offline.dataset import Dataset
from rlcli.registry import ConfigError, did_you_mean

Act = Callable[[np.ndarray], Any]
Progress = Callable[[int], None]
REFERENCE_EPISODES = 10


# ------------------------------------------------------------------------------------------------ noise
@dataclass(frozen=True)
class Noise:
    """`gaussian:σ`: N(0, σ) per action entry, in units of half the Box's range, then clipped to the bounds.
    `epsilon:ε`: with probability ε a uniformly random action instead (Box or Discrete)."""

    kind: str
    scale: float

    def __str__(self) -> str:
        return f"{self.kind}:{self.scale:g}"


def parse_noise(spec: str | None) -> Noise | None:
    """`gaussian:0.1` or `epsilon:0.1` (None: no noise); one line for anything else."""
    if spec is None:
        return None
    kind, _, value = spec.partition(":")
    if kind not in ("gaussian", "epsilon") or not value:
        raise ConfigError(f"noise {spec!r} is invalid: expected gaussian:<std> or epsilon:<probability>, e.g. "
                          "gaussian:0.1")
    try:
        scale = float(value)
    except ValueError:
        raise ConfigError(f"noise {spec!r} is invalid: {value!r} is not a number") from None
    if not np.isfinite(scale) or scale < 0 or (kind == "epsilon" and scale > 1):
        rule = "a probability in [0, 1]" if kind == "epsilon" else "a finite std >= 0"
        raise ConfigError(f"noise {spec!r} is invalid: {kind} takes {rule}")
    return Noise(kind, scale)


def with_noise(act: Act, noise: Noise | None, action_space: Any, rng: np.random.Generator) -> Act:
    """`act` with `noise` applied to each action it returns."""
    import gymnasium

    if noise is None or noise.scale == 0:
        return act
    box = isinstance(action_space, gymnasium.spaces.Box)
    if noise.kind == "gaussian" and not box:
        raise ConfigError(f"noise {noise} needs a Box action space; this env's is {action_space}: use epsilon:<p>")

    def noisy(obs: np.ndarray) -> Any:
        action = act(obs)
        if noise.kind == "epsilon":
            if rng.random() < noise.scale:
                return action_space.sample()
            return action
        low, high = action_space.low, action_space.high
        step = noise.scale * 0.5 * (high - low) * rng.standard_normal(np.shape(action))
        return np.clip(action + step, low, high).astype(action_space.dtype)

    return noisy


# ------------------------------------------------------------------------------------------------ envs
def make_env(env_id: str, kwargs: dict[str, Any] | None = None, max_episode_steps: int | None = None) -> Any:
    """One gymnasium env, or one line naming an unknown id (with the closest registered one)."""
    import gymnasium

    try:
        gymnasium.spec(env_id)
    except gymnasium.error.Error:
        known = [k for k in gymnasium.registry if "/" not in k or k.startswith("ALE/")]
        raise ConfigError(f"unknown env {env_id!r}{did_you_mean(env_id, known)}: give a registered gymnasium id "
                          "(e.g. Pendulum-v1)") from None
    extra: dict[str, Any] = {} if max_episode_steps is None else {"max_episode_steps": int(max_episode_steps)}
    try:
        return gymnasium.make(env_id, **(kwargs or {}), **extra)
    except Exception as error:  # a missing extra (mujoco, box2d), bad kwargs
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        raise ConfigError(f"env {env_id!r} cannot be made ({type(error).__name__}: {first})") from None


def random_act(action_space: Any) -> Act:
    """A uniform random policy over `action_space` (seed the space for repeatable actions)."""
    return lambda obs: action_space.sample()


def rollout(env: Any, act: Act, steps: int, seed: int = 0, progress: Progress | None = None) -> dict[str, np.ndarray]:
    """`steps` transitions of `act` in `env`: episode after episode, the first reset from `seed` and the next ones
    continuing the env's generator. The last episode is cut at `steps` (marked truncated), since every dataset's
    last row ends an episode."""
    rows: dict[str, list[Any]] = {k: [] for k in ("observations", "actions", "rewards", "next_observations",
                                                  "terminations", "truncations")}
    obs, _ = env.reset(seed=seed)
    for t in range(steps):
        action = act(obs)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        terminated = bool(terminated)
        truncated = bool(truncated) and not terminated or (t == steps - 1 and not terminated)
        for key, value in zip(rows, (obs, action, reward, next_obs, terminated, truncated), strict=True):
            rows[key].append(np.array(value, copy=True))
        obs = env.reset()[0] if terminated or truncated else next_obs
        if progress is not None:
            progress(1)
    arrays = {k: np.stack(v) for k, v in rows.items()}
    arrays["rewards"] = arrays["rewards"].astype(np.float32)
    arrays["terminations"] = arrays["terminations"].astype(bool)
    arrays["truncations"] = arrays["truncations"].astype(bool)
    if arrays["actions"].dtype.kind in "iu":
        arrays["actions"] = arrays["actions"].astype(np.int64)
    elif arrays["actions"].dtype.kind == "f":
        arrays["actions"] = arrays["actions"].astype(np.float32)
    return arrays


def episode_returns(env: Any, act: Act, episodes: int, seed: int) -> list[float]:
    """Whole episodes' undiscounted returns; episode i starts from seed `seed + i`."""
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            total += float(reward)
            done = bool(terminated or truncated)
        returns.append(total)
    return returns


def random_score(env_id: str, seed: int = 0, episodes: int = REFERENCE_EPISODES) -> float:
    """D4RL's ref_min_score: a uniform random policy's mean return over `episodes` episodes."""
    env = make_env(env_id)
    try:
        env.action_space.seed(seed)
        return float(np.mean(episode_returns(env, random_act(env.action_space), episodes, seed)))
    finally:
        env.close()


# ------------------------------------------------------------------------------------------------ datasets
def _dataset(arrays: dict[str, Any], env_id: str, name: str, metadata: dict[str, object]) -> Dataset:
    return check_dataset(Dataset(**arrays, env_id=env_id, name=name, metadata=metadata))


def make_random(env_id: str, steps: int, seed: int = 0, progress: Progress | None = None) -> Dataset:
    """`steps` transitions of a uniform random policy in `env_id`."""
    _check_steps(steps)
    env = make_env(env_id)
    try:
        env.action_space.seed(seed)
        arrays = rollout(env, random_act(env.action_space), steps, seed, progress)
    finally:
        env.close()
    return _dataset(arrays, env_id, f"{env_id}-random", {"source": "random", "seed": seed, "steps": steps})


def _check_steps(steps: int) -> None:
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ConfigError(f"steps={steps!r} is invalid: give a number of transitions >= 1")


def load_policy(run: str | Path, which: str = "best") -> Any:
    """The run's policy (rlcli.load): `which` = best, last or a checkpoint's env steps; best falls back to last
    when the run has no best model. One line for a missing run directory or checkpoint."""
    from rlcli.entry.api import RlcliError, load

    path = Path(run).expanduser()
    if not path.exists():
        raise ConfigError(f"run {str(run)!r}: no such run directory or checkpoint file")
    try:
        if path.is_dir() and which == "best" and not (path / "checkpoints" / "best.pt").is_file():
            which = "last"
        return load(path, load=int(which) if which.isdigit() else which)  # type: ignore[arg-type]
    except RlcliError as error:
        raise ConfigError(str(error)) from None


def policy_act(policy: Any, deterministic: bool) -> Act:
    """A Policy's action for one raw env observation."""
    from rlcli.entry.api import RlcliError

    def act(obs: np.ndarray) -> Any:
        try:
            return policy.predict(obs, deterministic=deterministic)[0]
        except RlcliError as error:
            raise ConfigError(str(error)) from None

    return act


def run_env_settings(policy: Any) -> tuple[dict[str, Any], int | None]:
    """The env kwargs and time limit a run trained with (its config's env section)."""
    env = policy.config.get("env", {})
    kwargs = dict(env.get("kwargs") or {})
    return kwargs, env.get("max_episode_steps")


def env_metadata(kwargs: dict[str, Any], limit: int | None) -> dict[str, object]:
    """What rebuilds the env besides its id (save_minari puts it in the env spec), when it differs from the
    registered defaults."""
    out: dict[str, object] = {}
    if kwargs:
        out["env_kwargs"] = {str(k): v for k, v in kwargs.items()}
    if limit is not None:
        out["max_episode_steps"] = int(limit)
    return out


# settings of rlcli's env config that change what the agent sees or earns: a replay buffer recorded under them
# holds observations or rewards that the plain env (its id) does not give; value: the setting's neutral value
TRANSFORMING = {"observation_indices": None, "sparse_reward": False, "atari": False, "frame_stack": 1,
                "time_feature": False, "frame_skip": 1, "resize": None, "grayscale": False}


def make_from_run(run: str | Path, steps: int, noise: Noise | None = None, deterministic: bool = False,
                  seed: int = 0, which: str = "best", progress: Progress | None = None) -> tuple[Dataset, Any]:
    """`steps` transitions of a trained run's policy in its env (sampled from its distribution unless
    `deterministic`, then `noise` on top). Returns the dataset and the policy (for its reference score)."""
    import torch

    _check_steps(steps)
    policy = load_policy(run, which)
    kwargs, limit = run_env_settings(policy)
    env = make_env(policy.env_id, kwargs, limit)
    try:
        env.action_space.seed(seed)
        torch.manual_seed(seed)  # a stochastic policy's draws
        act = with_noise(policy_act(policy, deterministic), noise, env.action_space, np.random.default_rng(seed))
        arrays = rollout(env, act, steps, seed, progress)
    finally:
        env.close()
    metadata: dict[str, object] = {
        "source": "run", "run": str(run), "checkpoint": str(policy.checkpoint), "algo": policy.algo_name,
        "deterministic": deterministic, "noise": None if noise is None else str(noise), "seed": seed,
        "steps": steps, **env_metadata(kwargs, limit)}
    return _dataset(arrays, policy.env_id, f"{policy.env_id}-{policy.algo_name}", metadata), policy


def run_score(policy: Any, seed: int = 0, episodes: int = REFERENCE_EPISODES) -> float:
    """D4RL's ref_max_score from a run: its policy's deterministic mean return (rlcli.evaluate, as rl-eval)."""
    from rlcli.entry.api import RlcliError
    from rlcli.entry.api_evaluate import evaluate

    try:
        return float(evaluate(policy, episodes=episodes, seed=seed, deterministic=True).mean_return)
    except RlcliError as error:
        raise ConfigError(str(error)) from None


def _insertion_order(size: int, pos: int, capacity: int | None) -> np.ndarray:
    """Slots from oldest to newest: 0..size-1 until the ring is full, then from `pos` round."""
    if capacity is None or size < capacity:
        return np.arange(size)
    return np.concatenate([np.arange(pos, size), np.arange(0, pos)])


def episodes_from_chains(obs: np.ndarray, next_obs: np.ndarray, terminated: np.ndarray,
                         num_envs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Episodes out of transitions that a vector env's steps interleave: row j follows row i when j comes within
    the next 2 x num_envs rows and observations[j] == next_observations[i] (and i did not terminate). Returns the
    row order (episodes one after another, each in its own order, by their first row) and the termination and
    truncation flags in that order; an episode whose next step is missing (a time limit, the ring's oldest
    entries, the run's end) is truncated. Identical observations of two envs at one step may swap the envs'
    rests of episode (each transition stays exact)."""
    n = len(obs)
    window = 2 * max(1, num_envs)
    flat_obs = obs.reshape(n, -1)
    flat_next = next_obs.reshape(n, -1)
    waiting: dict[bytes, list[int]] = {}  # next observation -> rows still looking for their successor
    successor = np.full(n, -1)
    has_predecessor = np.zeros(n, dtype=bool)
    for j in range(n):
        key = flat_obs[j].tobytes()
        rows = waiting.get(key)
        if rows:
            rows[:] = [i for i in rows if j - i <= window]
            if rows:
                i = rows.pop(0)
                successor[i] = j
                has_predecessor[j] = True
        if not terminated[j]:
            waiting.setdefault(flat_next[j].tobytes(), []).append(j)
    order, terminations, truncations = [], [], []
    for start in np.flatnonzero(~has_predecessor):
        i = int(start)
        while i != -1:
            order.append(i)
            end = successor[i] == -1
            terminations.append(bool(terminated[i]))
            truncations.append(bool(end and not terminated[i]))
            i = int(successor[i])
    return np.asarray(order, dtype=np.int64), np.asarray(terminations), np.asarray(truncations)


def make_from_buffer(run: str | Path) -> tuple[Dataset, Any]:
    """The replay buffer in a run's last checkpoint as a dataset ("medium-replay"): every stored transition, oldest
    first, regrouped into episodes (episodes_from_chains), actions as the env took them. Read through rlcli's safe
    checkpoint loader. One-step replay buffers only: n-step ones store returns, not rewards; reward-normalized runs
    store scaled rewards. Returns the dataset and the run's policy."""
    import torch

    from rlcli.entry.run_loading import checkpoint_of, is_run_dir, load_agent
    from rlcli.services import checkpoint

    path = Path(run).expanduser()
    if not path.exists():
        raise ConfigError(f"run {str(run)!r}: no such run directory or checkpoint file")
    file = path if path.is_file() else checkpoint_of(path, "last") if is_run_dir(path) else None
    if file is None:
        raise ConfigError(f"{str(run)!r} is a directory but not a run directory (no .hydra/overrides.yaml, no "
                          "checkpoints/)")
    data = checkpoint.load(file)
    checkpoint.require(data, file, "config", "algo")
    if "buffer" not in data:
        raise ConfigError(f"{file} holds no replay buffer (a saved policy, or a best-model file): give the run "
                          "directory or one of its checkpoints/ckpt_*.pt")
    config, buffer = data["config"], data["buffer"]
    algo = str(config.get("algo", {}).get("name"))
    keys = ("obs", "next_obs", "actions", "rewards", "discounts")
    if not isinstance(buffer, dict) or any(k not in buffer for k in keys):
        raise ConfigError(f"{file}: algo={algo} keeps no replay buffer of transitions (buffer="
                          f"{config.get('buffer', {}).get('name')}); --from-buffer needs an off-policy run (sac, td3, "
                          "ddpg, dqn, ...)")
    n_step = int(config.get("buffer", {}).get("n_step", 1) or 1)
    if n_step != 1:
        raise ConfigError(f"{file}: its buffer stores {n_step}-step returns (buffer.n_step={n_step}), not one step's "
                          "rewards; a dataset needs buffer.n_step=1")
    env_config = config.get("env", {})
    if env_config.get("normalize_reward"):
        raise ConfigError(f"{file}: its buffer's rewards were scaled (env.normalize_reward=true), not the env's own")
    for key, neutral in TRANSFORMING.items():
        if env_config.get(key, neutral) not in (None, neutral):
            raise ConfigError(f"{file}: its buffer holds what the agent saw under env.{key}={env_config[key]!r}, "
                              f"which the env id {env_config.get('id')} alone does not give; --from-buffer takes "
                              "runs on the plain env (use --from-run, which steps the env itself)")
    size, pos = int(buffer.get("size", len(buffer["rewards"]))), int(buffer.get("pos", 0))
    if size == 0:
        raise ConfigError(f"{file}: its replay buffer is empty")
    capacity = config.get("buffer", {}).get("capacity")
    slots = _insertion_order(size, pos, None if capacity is None else int(capacity))
    loaded = load_agent(file, {"device": "cpu", "seed": None, "configure_torch": False, "caller": "rl-dataset"}, [])
    with torch.inference_mode():
        actions = loaded.agent.algo.env_actions(buffer["actions"][:size]).cpu().numpy()
    obs = buffer["obs"][:size].cpu().numpy()[slots]
    next_obs = buffer["next_obs"][:size].cpu().numpy()[slots]
    terminated = (buffer["discounts"][:size].cpu().numpy() == 0)[slots]
    num_envs = int(config.get("train", {}).get("num_envs", 1) or 1)
    order, terminations, truncations = episodes_from_chains(obs, next_obs, terminated, num_envs)
    rewards = buffer["rewards"][:size].cpu().numpy()[slots].astype(np.float32)
    action_dtype = np.int64 if actions.dtype.kind in "iu" else np.float32
    arrays = {"observations": obs[order], "actions": actions[slots][order].astype(action_dtype),
              "rewards": rewards[order], "next_observations": next_obs[order], "terminations": terminations,
              "truncations": truncations}
    env_id = str(loaded.env_factory.spec.id)
    metadata: dict[str, object] = {"source": "buffer", "run": str(run), "checkpoint": str(file), "algo": algo,
                                   "env_steps": int(data.get("env_steps", 0)), "buffer_size": size,
                                   **env_metadata(dict(env_config.get("kwargs") or {}),
                                                  env_config.get("max_episode_steps"))}
    dataset = _dataset(arrays, env_id, f"{env_id}-{algo}-replay", metadata)
    from rlcli.entry.api import Policy

    return dataset, Policy(loaded)


def concat(datasets: list[Dataset], name: str = "concat") -> Dataset:
    """One dataset of several, rows in order ("medium-expert" = medium + expert). They must share the env and the
    observation and action shapes and dtypes; each part's last row ends an episode. Reference scores: the parts'
    lowest ref_min_score and highest ref_max_score."""
    if len(datasets) < 2:
        raise ConfigError("concat needs at least two datasets")
    first = datasets[0]
    for other in datasets[1:]:
        if other.env_id != first.env_id and None not in (other.env_id, first.env_id):
            raise ConfigError(f"dataset {other.name!r}: env_id is {other.env_id}, expected {first.env_id} (as "
                              f"{first.name!r} has): concatenated datasets share their env")
        for field in ("observations", "actions"):
            a, b = getattr(first, field), getattr(other, field)
            if a.shape[1:] != b.shape[1:] or a.dtype != b.dtype:
                raise ConfigError(f"dataset {other.name!r}: {field} have shape {b.shape[1:]} and dtype {b.dtype}, "
                                  f"expected {a.shape[1:]} and {a.dtype} (as {first.name!r} has)")
    arrays: dict[str, Any] = {}
    for field in ("observations", "actions", "rewards", "next_observations", "terminations"):
        arrays[field] = np.concatenate([getattr(d, field) for d in datasets])
    truncations = []
    for d in datasets:
        t = d.truncations.copy()
        if not (d.terminations[-1] or t[-1]):
            t[-1] = True  # its last episode ends with the part
        truncations.append(t)
    arrays["truncations"] = np.concatenate(truncations)
    lows = [d.ref_min_score for d in datasets if d.ref_min_score is not None]
    highs = [d.ref_max_score for d in datasets if d.ref_max_score is not None]
    metadata: dict[str, object] = {"source": "concat", "parts": [d.name for d in datasets],
                                   "sizes": [len(d) for d in datasets]}
    dataset = Dataset(**arrays, env_id=next((d.env_id for d in datasets if d.env_id), None),
                      ref_min_score=min(lows) if lows else None, ref_max_score=max(highs) if highs else None,
                      name=name, metadata=metadata)
    return check_dataset(dataset)


# ------------------------------------------------------------------------------------------------ info
@dataclass
class Summary:
    """What `rl-dataset info` prints."""

    name: str
    env_id: str | None
    transitions: int
    episodes: int
    mean_return: float
    min_return: float
    max_return: float
    ref_min_score: float | None
    ref_max_score: float | None
    metadata: dict[str, object]


def summarize(dataset: Dataset) -> Summary:
    """Transitions, episodes and their returns (an unfinished last episode counts as one)."""
    ends = dataset.episode_ends
    sums = np.add.reduceat(dataset.rewards.astype(np.float64), np.concatenate([[0], ends[:-1] + 1]))
    return Summary(dataset.name, dataset.env_id, len(dataset), len(ends), float(sums.mean()), float(sums.min()),
                   float(sums.max()), dataset.ref_min_score, dataset.ref_max_score, dict(dataset.metadata))
