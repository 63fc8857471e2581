"""The training loop: collect -> update -> log -> test -> checkpoint, on one clock.

The trainer owns every counter (`TrainState`); nothing else keeps its own step count. Building
the trainer validates the whole config and creates envs and networks; it writes nothing to the
run directory, so a bad config leaves no TensorBoard log or checkpoint behind.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from gymnasium.spaces import Discrete
from omegaconf import DictConfig, OmegaConf

import rlcli.actors  # noqa: F401  (registers actors)
import rlcli.algos  # noqa: F401  (registers algorithms)
import rlcli.buffers  # noqa: F401  (registers buffers)
from rlcli import checkpoint
from rlcli.addons import build_addons
from rlcli.collector import Collector, evaluate
from rlcli.envs import GymEnvFactory
from rlcli.envs.state import capturable, get_env_state, set_env_state
from rlcli.log import RunLogger
from rlcli.registry import ACTORS, ALGOS, BUFFERS, ENVS, ConfigError, check_kwargs, require
from rlcli.runtime import configure_torch, resolve_device, seconds_since_process_start, seed_everything
from rlcli.schedules import apply_schedules, build_schedules
from rlcli.timing import PhaseClock


@dataclass
class TrainSettings:
    """The `train:` config section (see conf/config.yaml for what each key means)."""

    total_steps: int = 1_000_000
    num_envs: int = 8
    vector_mode: Literal["auto", "sync", "async", "numpy"] = "auto"
    test_every: int = 10_000
    test_episodes: int = 10
    log_every: int = 5_000
    stop_reward: float | str | None = "env"
    checkpoint_every: int = 0
    keep_checkpoints: int = 3

    def __post_init__(self) -> None:
        require(self.total_steps > 0, "train.total_steps", self.total_steps, "must be > 0")
        require(self.num_envs > 0, "train.num_envs", self.num_envs, "must be > 0")
        require(self.test_every >= 0, "train.test_every", self.test_every, "must be >= 0 (0 disables testing)")
        require(self.test_episodes > 0, "train.test_episodes", self.test_episodes, "must be > 0")
        require(self.log_every > 0, "train.log_every", self.log_every, "must be > 0")
        require(self.checkpoint_every >= 0, "train.checkpoint_every", self.checkpoint_every, "must be >= 0")
        require(self.keep_checkpoints > 0, "train.keep_checkpoints", self.keep_checkpoints, "must be > 0")
        require(not isinstance(self.stop_reward, str) or self.stop_reward == "env", "train.stop_reward",
                self.stop_reward, "use env (the env's reward threshold), a number, or null")


@dataclass
class TrainState:
    """Every counter of a run; saved whole in checkpoints."""

    env_steps: int = 0
    updates: int = 0
    episodes: int = 0
    tests: int = 0
    last_test_return: float | None = None
    best_test_return: float | None = None
    train_seconds: float = 0.0  # wall time spent in run(), summed over resumes
    finished: bool = False  # the budget or the stop reward was reached


def crossed(step: int, previous: int, every: int) -> bool:
    """True when the clock passed a multiple of `every` between `previous` and `step`."""
    return every > 0 and step // every > previous // every


def _section(cfg: DictConfig, key: str) -> dict[str, Any]:
    node = cfg.get(key)
    if node is None:
        raise ConfigError(f"the config has no '{key}' section")
    return OmegaConf.to_container(node, resolve=True)  # type: ignore[return-value]


def _actor_section(cfg: DictConfig) -> dict[str, Any]:
    """The actor config without `init_from`, which the trainer handles for every actor alike."""
    actor = _section(cfg, "actor")
    actor.pop("init_from", None)
    return actor


def _algo_section(cfg: DictConfig) -> dict[str, Any]:
    """The algo config without `schedules`, which the trainer applies for every algorithm alike."""
    algo = _section(cfg, "algo")
    algo.pop("schedules", None)
    algo.pop("policy_loss_addons", None)
    return algo


def check_buffer_fits(algo_name: str, buffer_name: str) -> None:
    """On-policy algorithms need rollout storage, off-policy ones a replay buffer."""
    on_policy = bool(getattr(ALGOS.get(algo_name), "on_policy", True))
    if bool(getattr(BUFFERS.get(buffer_name), "on_policy", True)) != on_policy:
        valid = [n for n in BUFFERS.names() if getattr(BUFFERS.get(n), "on_policy", True) == on_policy]
        kind = "on-policy" if on_policy else "off-policy"
        raise ConfigError(
            f"buffer={buffer_name} does not fit the {kind} algo={algo_name}; choose from: {', '.join(valid)}"
        )


def check_config(cfg: DictConfig) -> None:
    """Key and type checks of every section, without building anything (used before Hydra starts)."""
    check_kwargs(TrainSettings, _section(cfg, "train"), prefix="train")
    ENVS.check(_section(cfg, "env"))
    ACTORS.check(_actor_section(cfg), context=("observation_space", "action_space", "normalize_obs", "clip_obs",
                                                "heads", "value_outputs"))
    ALGOS.check(_algo_section(cfg), context=("actor", "num_envs", "action_space"))
    check_buffer_fits(_section(cfg, "algo")["name"], _section(cfg, "buffer")["name"])
    BUFFERS.check(_section(cfg, "buffer"), context=(
        "n_steps", "num_envs", "obs_shape", "action_shape", "discrete", "device", "gamma", "goal", "value_size",
        "obs_dtype"))


logger = logging.getLogger("rlcli")


class Trainer:
    def __init__(self, cfg: DictConfig, run_dir: Path | None) -> None:
        check_config(cfg)
        self.cfg, self.run_dir = cfg, run_dir
        self.settings = TrainSettings(**_section(cfg, "train"))
        require(isinstance(cfg.seed, int), "seed", cfg.seed, "must be an integer")
        self.device = resolve_device(cfg.device)
        configure_torch(int(cfg.get("torch_threads", 1)), bool(cfg.deterministic))
        seed_everything(cfg.seed)

        env_factory: GymEnvFactory = ENVS.build(_section(cfg, "env"))
        algo_cfg = _algo_section(cfg)
        algo_cls = ALGOS.get(algo_cfg["name"])
        s = self.settings
        self.envs = env_factory.make(s.num_envs, s.vector_mode, gamma=float(algo_cfg.get("gamma", 0.99)))
        self.test_envs = env_factory.make(s.test_episodes, s.vector_mode, eval=True)
        obs_space, act_space = self.envs.single_observation_space, self.envs.single_action_space
        supported = getattr(algo_cls, "action_spaces", ("Discrete", "Box"))
        if type(act_space).__name__ not in supported:
            raise ConfigError(
                f"algo={algo_cfg['name']} cannot handle {type(act_space).__name__} actions of env "
                f"{env_factory.spec.id}; it supports: {', '.join(supported)}"
            )
        on_policy = bool(getattr(algo_cls, "on_policy", True))
        actor_name = _section(cfg, "actor")["name"]
        supported_actors = getattr(algo_cls, "supported_actors", None)
        if supported_actors is not None and actor_name not in supported_actors:
            raise ConfigError(f"algo={algo_cfg['name']} does not support actor={actor_name} yet; "
                              f"choose from: {', '.join(supported_actors)}")
        if hasattr(algo_cls, "check_observation_space"):
            algo_cls.check_observation_space(obs_space, env_factory.spec.id)
        value_outputs = int(getattr(algo_cls, "value_outputs", 1))  # rnd_ppo: extrinsic + intrinsic
        actor = ACTORS.build(
            _actor_section(cfg), observation_space=obs_space, action_space=act_space,
            normalize_obs=env_factory.normalize_obs, clip_obs=env_factory.clip_obs,
            heads="actor_critic" if on_policy else "torso",
            **({"value_outputs": value_outputs} if value_outputs > 1 else {}),
        )
        if on_policy:
            self.algo = ALGOS.build(algo_cfg, actor=actor.to(self.device), num_envs=s.num_envs)
        else:  # off-policy algorithms build their own heads on the actor config's torso
            self.algo = ALGOS.build(algo_cfg, actor=actor, action_space=act_space, num_envs=s.num_envs)
            self.algo.actor.to(self.device)
        addons = cfg.algo.get("policy_loss_addons")
        build_addons(self.algo, OmegaConf.to_container(addons) if addons else None)
        schedules = cfg.algo.get("schedules")
        self.schedules = build_schedules(self.algo, OmegaConf.to_container(schedules) if schedules else None)
        init_from = cfg.actor.get("init_from")
        if init_from:
            load_actor_weights(self.algo.actor, Path(str(init_from)))
        buffer_name = _section(cfg, "buffer")["name"]
        sequences = bool(getattr(BUFFERS.get(buffer_name), "sequences", False))
        if not on_policy and getattr(actor, "recurrent", False) and not sequences:
            raise ConfigError(f"algo={algo_cfg['name']} with actor={actor_name} learns from stored sequences: use "
                              f"buffer=sequence (R2D2 burn-in); buffer={buffer_name} holds single transitions")
        self.obs_dtype = torch.uint8 if getattr(actor, "uint8_input", False) else torch.float32
        self.buffer = BUFFERS.build(
            _section(cfg, "buffer"), n_steps=self.algo.n_steps, num_envs=s.num_envs,
            obs_shape=obs_space.shape, action_shape=act_space.shape, discrete=isinstance(act_space, Discrete),
            device=self.device, gamma=self.algo.gamma, goal=env_factory.goal,
            **({"carry_size": actor.carry_size} if getattr(actor, "recurrent", False) else {}),
            **({"value_size": value_outputs} if value_outputs > 1 else {}),
            **({"obs_dtype": self.obs_dtype} if self.obs_dtype != torch.float32 else {}),
        )
        if not on_policy:
            capacity = getattr(self.buffer, "capacity", None)
            require(capacity is None or capacity >= self.algo.batch_size, "buffer.capacity", capacity,
                    f"must hold at least algo.batch_size={self.algo.batch_size} transitions")
        self.stop_reward = env_factory.reward_threshold if s.stop_reward == "env" else s.stop_reward
        self.clock = PhaseClock()
        self.collector = Collector(self.envs, actor.normalizer, self.device, seed=cfg.seed, clock=self.clock,
                                   obs_dtype=self.obs_dtype)
        self.state = TrainState()
        self.recent_returns: collections.deque[float] = collections.deque(maxlen=100)
        self.recent_lengths: collections.deque[int] = collections.deque(maxlen=100)
        self._stop_signal: int | None = None
        # Set by whoever runs the trainer: sweeps print one line per event instead of progress bars,
        # and an Optuna trial gets each test result (`after_test` returns True to stop: pruned).
        self.console_mode: Literal["full", "lines", "off"] = "full" if cfg.log.console else "off"
        self.console_prefix = ""
        self.after_test: Callable[[TrainState], bool] | None = None
        self.stop_reason: Literal["budget", "stop_reward", "pruned"] | None = None
        if cfg.get("resume"):
            self.restore(Path(str(cfg.resume)))

    # ------------------------------------------------------------------------------------- the loop
    def run(self) -> float:
        """Train until train.total_steps or the stop reward; return the last mean test return."""
        s, state = self.settings, self.state
        assert self.run_dir is not None, "a trainer built without a run directory can only be checked"
        if self._already_done():
            self.close()
            print(f"rl-train: this run already finished at {state.env_steps:,} env steps "
                  f"(test return {state.last_test_return}); raise train.total_steps to train longer",
                  file=sys.stderr)
            return _as_return(state.last_test_return)
        state.finished = False
        log = RunLogger(self.run_dir, s.total_steps, self.console_mode, bool(self.cfg.log.tensorboard),
                        start_step=state.env_steps, start_seconds=state.train_seconds, prefix=self.console_prefix)
        log.message(f"rlcli: {self.cfg.algo.name} on {self.cfg.env.id}, {s.total_steps:,} env steps, "
                    f"device {self.device}, run dir {self.run_dir}"
                    + (f", resumed at {state.env_steps:,} env steps" if state.env_steps else ""))
        restore_signals = self._catch_stop_signals()
        clock = self.clock
        clock.restart()
        start, start_steps, stopped_early = time.perf_counter(), state.env_steps, False
        age = seconds_since_process_start()
        if age is not None:
            logger.info("start-up: the first env step comes %.2f s after the process started", age)
        self._seconds_before_run = state.train_seconds
        try:
            while state.env_steps < s.total_steps:
                # collect
                warming_up = not self.algo.on_policy and state.env_steps < self.algo.learning_starts
                self.algo.progress = min(1.0, state.env_steps / s.total_steps)
                stats = self.collector.collect(self.algo, self.buffer, random_actions=warming_up)
                previous = state.env_steps
                state.env_steps += stats.steps
                state.episodes += len(stats.episode_returns)
                self.recent_returns.extend(stats.episode_returns)
                self.recent_lengths.extend(stats.episode_lengths)
                # update
                metrics: dict[str, Any] = {}
                if self.algo.on_policy or state.env_steps >= self.algo.learning_starts:
                    self.algo.env_steps = state.env_steps
                    progress = min(1.0, state.env_steps / s.total_steps)
                    scheduled = apply_schedules(self.algo, self.schedules, progress)
                    with clock("update"):
                        metrics = self.algo.update(self.buffer, progress=progress)
                    metrics.update({f"schedule_{k}": v for k, v in scheduled.items()})
                    state.updates += 1
                sps = (state.env_steps - start_steps) / (time.perf_counter() - start)
                # test
                last_phase = state.env_steps >= s.total_steps
                reached = pruned = False
                if crossed(state.env_steps, previous, s.test_every) or (last_phase and s.test_every > 0):
                    with clock("test"):
                        self._test(log)
                    reached = self.stop_reward is not None and state.last_test_return >= self.stop_reward
                    pruned = not reached and self.after_test is not None and self.after_test(state)
                # log
                if crossed(state.env_steps, previous, s.log_every) or last_phase or reached:
                    with clock("log"):
                        scalars = {f"train/{k}": float(v) for k, v in metrics.items()}  # one sync per log
                        scalars["time/sps"] = sps
                        scalars.update(clock.scalars())
                        scalars["rollout/episodes"] = state.episodes
                        if self.recent_returns:
                            scalars["rollout/return_mean"] = float(np.mean(self.recent_returns))
                            scalars["rollout/ep_len_mean"] = float(np.mean(self.recent_lengths))
                        log.scalars(scalars, state.env_steps)
                        log.table(state.env_steps)
                with clock("log"):
                    log.progress(state.env_steps, sps, state.last_test_return, clock)
                if pruned and not last_phase:
                    self.stop_reason = "pruned"
                    log.message(f"pruned at {state.env_steps:,} env steps (test return {state.last_test_return:.1f}): "
                                "the sweeper judged this trial hopeless")
                    break
                if reached:
                    stopped_early = not last_phase
                    log.message(f"test return {state.last_test_return:.1f} >= stop reward {self.stop_reward}: "
                                f"stopping at {state.env_steps:,} env steps")
                    break
                # checkpoint (and the safe point for Ctrl-C / SIGTERM)
                if self._stop_signal is not None:
                    self._save(start)
                    name = signal.Signals(self._stop_signal).name
                    log.message(f"{name}: stopped at {state.env_steps:,} env steps with a checkpoint saved; "
                                f"resume with: rl-train resume={self.run_dir}")
                    log.close()
                    self.close()
                    raise SystemExit(128 + self._stop_signal)
                if crossed(state.env_steps, previous, s.checkpoint_every) and state.env_steps < s.total_steps:
                    with clock("checkpoint"):
                        self._save(start)
        finally:
            restore_signals()
        self.stop_reason = self.stop_reason or ("stop_reward" if stopped_early else "budget")
        state.finished = self.stop_reason != "pruned"  # a pruned run can still be resumed and finished
        with clock("checkpoint"):
            self._save(start)
        log.message(f"done: {state.env_steps:,} env steps in {state.train_seconds:.1f} s "
                    f"({(state.env_steps - start_steps) / (time.perf_counter() - start):.0f} SPS), "
                    f"last test return {state.last_test_return}, "
                    f"{ {'budget': 'budget reached', 'stop_reward': 'stopped early'}.get(self.stop_reason, 'pruned')}")
        log.message(f"time: {clock.summary(top=8)}")
        log.close()
        self.close()
        return _as_return(state.last_test_return)

    def close(self) -> None:
        self.envs.close()
        self.test_envs.close()

    def _already_done(self) -> bool:
        state = self.state
        if not state.finished:
            return False
        reached = (self.stop_reward is not None and state.last_test_return is not None
                   and state.last_test_return >= self.stop_reward)
        return state.env_steps >= self.settings.total_steps or reached

    def _test(self, log: RunLogger) -> None:
        state = self.state
        result = evaluate(self.test_envs, self.algo, self.algo.actor.normalizer, self.device,
                          seed=int(self.cfg.seed) + 100_003 * (state.tests + 1), obs_dtype=self.obs_dtype)
        state.tests += 1
        state.last_test_return = result.mean_return
        best = state.best_test_return
        state.best_test_return = result.mean_return if best is None else max(best, result.mean_return)
        log.scalars({"eval/return_mean": result.mean_return, "eval/return_std": float(result.returns.std()),
                     "eval/ep_len_mean": float(result.lengths.mean())}, state.env_steps)
        log.test_result(state.env_steps, result.returns.tolist(), result.lengths.tolist())

    def _catch_stop_signals(self):
        """First Ctrl-C / SIGTERM: finish the iteration, checkpoint, exit. A second one stops at once."""

        def handler(signum: int, frame: Any) -> None:
            if self._stop_signal is not None:
                raise KeyboardInterrupt
            self._stop_signal = signum

        previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):  # not the main thread (some launchers): leave signals alone
                previous[sig] = signal.signal(sig, handler)

        def restore() -> None:
            for sig, old in previous.items():
                signal.signal(sig, old)

        return restore

    # ------------------------------------------------------------------------------- checkpoints
    def _save(self, start: float) -> Path:
        self.state.train_seconds = self._seconds_before_run + time.perf_counter() - start
        return self.save_checkpoint()

    def save_checkpoint(self) -> Path:
        """Everything needed to continue exactly: see `restore`."""
        assert self.run_dir is not None
        envs_ok = capturable(self.envs)
        payload = {
            "config": OmegaConf.to_container(self.cfg, resolve=True),
            "state": dataclasses.asdict(self.state),
            "algo": self.algo.state_dict(),
            "buffer": self.buffer.state_dict(),
            "rng": checkpoint.rng_state(),
            "collector": self.collector.state_dict(),
            "envs": get_env_state(self.envs) if envs_ok else None,
            "recent": {"returns": list(self.recent_returns), "lengths": list(self.recent_lengths)},
        }
        return checkpoint.save(self.run_dir / "checkpoints", self.state.env_steps, payload,
                               keep=self.settings.keep_checkpoints)

    def restore(self, path: Path) -> None:
        from rlcli.resume import check_compatible

        data = checkpoint.load(path, map_location=self.device)
        current = OmegaConf.to_container(self.cfg, resolve=True)
        check_compatible(data["config"], current, path)  # type: ignore[arg-type]
        self.algo.load_state_dict(data["algo"])
        self.buffer.load_state_dict(data["buffer"])
        self.state = TrainState(**data["state"])
        self.recent_returns.extend(data["recent"]["returns"])
        self.recent_lengths.extend(data["recent"]["lengths"])
        self.collector.load_state_dict(data["collector"])
        if data["envs"] is not None and capturable(self.envs):
            set_env_state(self.envs, data["envs"])
        else:
            self.collector.reset(seed=int(self.cfg.seed) + self.state.updates)
            logger.warning("the env state could not be saved or restored (e.g. async vector envs): the envs were "
                           "reset, so this resume continues from fresh episodes rather than exactly")
        checkpoint.set_rng_state(data["rng"])


def load_actor_weights(actor: Any, path: Path) -> None:
    """Warm start (`actor.init_from=<checkpoint>`): copy another run's network and normalizer."""
    path = checkpoint.resolve(path)
    data = checkpoint.load(path)
    weights = data["algo"]["actor"]
    try:
        actor.load_state_dict(weights)
    except RuntimeError as error:
        first = str(error).strip().splitlines()
        detail = first[1].strip() if len(first) > 1 else first[0]
        raise ConfigError(f"actor.init_from={str(path)!r} does not fit this actor: {detail}") from None


def _as_return(value: float | None) -> float:
    return float("nan") if value is None else value
