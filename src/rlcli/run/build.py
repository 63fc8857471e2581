"""config -> Components: every check and every construction of a run, in one place, once.

`build(cfg)` reads the registered specs (contracts.py) to check that the chosen env, network,
algorithm and buffer fit together, then builds them on the run's device. It writes nothing, so a
bad config leaves no run directory behind. The trainer only runs the loop over what this returns.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from gymnasium.spaces import Discrete
from gymnasium.vector import VectorEnv
from omegaconf import DictConfig, OmegaConf

import rlcli.buffers  # noqa: F401  (registers the storages)
from rlcli.actors.weights import load_network_weights
from rlcli.algos.agent import algo_section, build_agent, network_section, section
from rlcli.algos.grouped import loop_partners, shares_rollout
from rlcli.collectors.local import Collector, ExperienceCollector
from rlcli.collectors.offline import OfflineCollector
from rlcli.collectors.ray_collector import RayCollector
from rlcli.collectors.ray_settings import check_fits, check_ray, ray_settings
from rlcli.contracts import (
    Algorithm,
    AlgoSpec,
    BufferSpec,
    Learner,
    NetworkSpec,
    OffPolicyLearner,
    OnPolicyLearner,
    Storage,
)
from rlcli.envs import GymEnvFactory, VectorMode
from rlcli.envs.masks import mask_width
from rlcli.envs.multiagent import find_attr
from rlcli.envs.turn_based import check_turn_based
from rlcli.registry import ACTORS, ALGOS, BUFFERS, ENVS, ConfigError, check_kwargs, require
from rlcli.run.algo_defaults import CONTEXT
from rlcli.run.offline import MAKE_ONE, OfflineData
from rlcli.schedules import ScheduledValue, build_schedules
from rlcli.services.runtime import (
    configure_torch,
    max_torch_threads,
    resolve_device,
    seed_everything,
    usable_cores,
)
from rlcli.services.timing import PhaseClock
from rlcli.services.tracking import check_tracking


@dataclass
class TrainSettings:
    """The `train:` config section (see conf/config.yaml for what each key means)."""

    total_steps: int = 1_000_000
    num_envs: int = 8
    vector_mode: Literal["auto", "sync", "async", "numpy", "envpool"] = "auto"
    test_every: int = 10_000
    test_episodes: int = 10
    log_every: int = 5_000
    tb_every: int | str = "auto"
    stop_reward: float | str | None = "env"
    checkpoint_every: int = 0
    keep_checkpoints: int = 3
    on_nonfinite: Literal["stop", "skip", "rollback"] = "stop"
    max_nonfinite: int = 3
    step_timeout: float | None = None

    def __post_init__(self) -> None:
        require(self.total_steps > 0, "train.total_steps", self.total_steps, "must be > 0")
        require(0 < self.num_envs <= MAX_NUM_ENVS, "train.num_envs", self.num_envs,
                f"must be in [1, {MAX_NUM_ENVS}] (one process steps them all; collector=ray spreads more over workers)")
        if self.vector_mode == "async":
            most = max_async_envs()
            require(self.num_envs <= most, "train.num_envs", self.num_envs,
                    f"must be in [1, {most}] with train.vector_mode=async (one process per env: 4 per usable core, at "
                    "least 16); use sync or numpy for more")
        require(self.test_every >= 0, "train.test_every", self.test_every, "must be >= 0 (0 disables testing)")
        require(0 < self.test_episodes <= MAX_NUM_ENVS, "train.test_episodes", self.test_episodes,
                f"must be in [1, {MAX_NUM_ENVS}] (one test env per episode, all in this process)")
        require(self.log_every > 0, "train.log_every", self.log_every, "must be > 0")
        require(self.tb_every == "auto" or (isinstance(self.tb_every, int) and self.tb_every > 0), "train.tb_every",
                self.tb_every, "use auto or a number of env steps > 0")
        require(self.checkpoint_every >= 0, "train.checkpoint_every", self.checkpoint_every, "must be >= 0")
        require(self.keep_checkpoints > 0, "train.keep_checkpoints", self.keep_checkpoints, "must be > 0")
        require(self.on_nonfinite in ("stop", "skip", "rollback"), "train.on_nonfinite", self.on_nonfinite,
                "choose from: stop, skip, rollback")
        require(self.max_nonfinite > 0, "train.max_nonfinite", self.max_nonfinite, "must be > 0")
        require(not isinstance(self.stop_reward, str) or self.stop_reward == "env", "train.stop_reward",
                self.stop_reward, "use env (the env's reward threshold), a number, or null")
        require(not isinstance(self.stop_reward, float) or math.isfinite(self.stop_reward), "train.stop_reward",
                self.stop_reward, "use a finite number (the test return that stops the run), env (the env's reward "
                "threshold), or null (never stop early)")
        require(self.step_timeout is None or (math.isfinite(self.step_timeout) and self.step_timeout > 0),
                "train.step_timeout", self.step_timeout, "use a number of seconds > 0, or null (no timeout)")


# One process steps every env of a run (collector=local): past this many, a sync env's construction alone takes
# minutes and a rollout's tensors gigabytes; no shipped config comes near it.
MAX_NUM_ENVS = 65_536


def max_async_envs() -> int:
    """train.vector_mode=async starts one process per env: past 4 per core they only wait for each other."""
    return max(16, 4 * usable_cores())


@dataclass
class Components:
    """Everything a run is made of; the trainer loops over it, run_state.py saves and restores it."""

    cfg: DictConfig
    settings: TrainSettings
    device: torch.device
    spec: AlgoSpec
    envs: VectorEnv  # the training envs (collector=ray: one env that gave the spaces; the workers hold the rest)
    test_envs: VectorEnv
    learner: Learner  # the algorithm and its storage, paired by kind (contracts.py)
    collector: ExperienceCollector
    schedules: list[ScheduledValue]  # every value over the run, applied before each collect and each update
    addons: list[Any]  # policy-loss add-ons
    obs_dtype: torch.dtype
    carry_size: int  # > 0: the networks are recurrent
    stop_reward: float | None
    video_envs: VectorEnv | None = None  # log.video_every > 0: one test env that renders frames
    clock: PhaseClock = field(default_factory=PhaseClock)
    offline: OfflineData | None = None  # dataset=: the run learns from it alone (envs is then test_envs itself)
    recent_returns: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=100))
    recent_lengths: collections.deque[int] = field(default_factory=lambda: collections.deque(maxlen=100))
    # what building or resuming found that the user should know (a resume whose envs were reset): said when the run
    # starts, on the console and in train.log (before that, a run's logging is not set up)
    notices: list[str] = field(default_factory=list)

    @property
    def algo(self) -> Algorithm:
        return self.learner.algo

    @property
    def buffer(self) -> Storage:
        return self.learner.buffer

    @property
    def unit(self) -> str:
        """What the run's clock counts: env steps, or (dataset=) gradient steps, then (offline.online_steps) env
        steps."""
        if self.offline is None:
            return "env steps"
        return "gradient steps" if not self.offline.settings.online_steps else "steps"

    @property
    def steps_per_phase(self) -> int:
        """The clock's steps per loop iteration: a collect phase's env steps, or an offline run's gradient steps."""
        if isinstance(self.collector, OfflineCollector):
            return self.collector.steps
        return int(self.algo.steps_per_collect) * self.settings.num_envs

    def close(self, terminate: bool = False) -> None:
        """Close the collector and the envs. `terminate`: an async vector env's workers are ended at once, not waited
        for (after a step that timed out or was interrupted, a worker may still be inside it)."""
        self.collector.close()
        closed: list[VectorEnv] = []
        for envs in (self.envs, self.test_envs, self.video_envs):
            if envs is not None and not any(envs is done for done in closed):
                close_envs(envs, terminate)
                closed.append(envs)


def close_envs(envs: VectorEnv, terminate: bool = False) -> None:
    """`envs.close()`; with `terminate`, gymnasium's async workers are terminated rather than waited for, without
    its warning that a call was still pending (that is why they are terminated)."""
    if not terminate:
        envs.close()
        return
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            envs.close(terminate=True)
        except TypeError:  # a vector env whose close takes no arguments
            envs.close()


NETWORK_CONTEXT = ("observation_space", "action_space", "normalize_obs", "clip_obs", "heads", "value_outputs",
                   "use_sde")
ALGO_CONTEXT = CONTEXT  # algo_defaults.py reads the settings without them
BUFFER_CONTEXT = ("n_steps", "num_envs", "obs_shape", "action_shape", "discrete", "device", "gamma", "goal",
                  "value_size", "obs_dtype", "carry_size", "normalizer", "mask_size")


def check_config(cfg: DictConfig) -> None:
    """Names, keys, value types and how the parts fit: everything that needs no env and no network."""
    check_kwargs(TrainSettings, section(cfg, "train"), prefix="train")
    check_finite(cfg)
    ENVS.check(section(cfg, "env"))
    ACTORS.check(network_section(cfg), context=NETWORK_CONTEXT)
    ALGOS.check(algo_section(cfg), context=ALGO_CONTEXT)
    algo_name, buffer_name = cfg.algo.name, cfg.buffer.name
    spec: AlgoSpec = ALGOS.spec(algo_name)
    buffer_spec: BufferSpec = BUFFERS.spec(buffer_name)
    if buffer_spec.on_policy != spec.on_policy:
        valid = [n for n in BUFFERS.names() if BUFFERS.spec(n).on_policy == spec.on_policy]
        kind = "on-policy" if spec.on_policy else "off-policy"
        raise ConfigError(f"buffer={buffer_name} does not fit the {kind} algo={algo_name}; "
                          f"choose from: {', '.join(valid)}")
    BUFFERS.check(section(cfg, "buffer"), context=BUFFER_CONTEXT)
    if not spec.on_policy and cfg.env.get("critic_state"):  # env=pz: the value network's extra inputs (MAPPO)
        raise ConfigError(f"env.critic_state=true gives the centralized critic of algo=mappo (its value network alone "
                          f"reads the global state); algo={algo_name}'s networks, its policy too, would all read it: "
                          "use env.critic_state=false (independent learners: IQL, ISAC, IDDPG)")
    if cfg.algo.get("groups") and not shares_rollout(spec, spec):  # before env.joint's lines, which it would loop on
        raise ConfigError(f"algo.groups gives each group an on-policy algorithm of its own on one rollout; "
                          f"algo={algo_name} is not one: choose from: {', '.join(loop_partners(spec))}")
    if cfg.algo.get("groups") and cfg.env.get("name") in ("pz", "vmas"):  # a multi-agent env: say which setting
        needs = [fix for bad, fix in ((not cfg.env.get("groups"), "env.groups (=prefix, or {a: [agent_0], b: "
                                       "[agent_1]})"), (cfg.env.get("joint"), "env.joint=false"),
                                      (not cfg.env.get("agent_id"), "env.agent_id=true")) if bad]
        if needs:
            raise ConfigError(f"algo.groups gives each group of env.groups an algorithm of its own: set "
                              f"{' and '.join(needs)}")
    joint = [n for n in ALGOS.names() if any(kind.startswith("Joint") for kind in ALGOS.spec(n).action_spaces)]
    if cfg.env.get("joint") is False and algo_name in joint:
        raise ConfigError(f"algo={algo_name} learns from a team's joint transitions, and env.joint=false gives one row "
                          f"per agent: use env.joint=true, as conf/algo/{algo_name}.yaml sets")
    if cfg.env.get("joint") is True and algo_name not in joint and cfg.env.get("name") in ("pz", "vmas"):
        raise ConfigError(f"env.joint=true gives a team's joint transitions, which algo={', '.join(joint)} learn from; "
                          f"this run's algorithm ({algo_name}) learns from one row per agent: use env.joint=false")
    network_name = cfg.actor.name
    if spec.networks is not None and network_name not in spec.networks:
        raise ConfigError(f"algo={algo_name} does not support actor={network_name} yet; "
                          f"choose from: {', '.join(spec.networks)}")
    network_spec: NetworkSpec = ACTORS.spec(network_name)
    if algo_cfg_flag(cfg, "use_sde") and not network_spec.sde:
        sde_actors = ", ".join(n for n in ACTORS.names() if ACTORS.spec(n).sde)
        raise ConfigError(f"algo.use_sde=true (gSDE) is not built for actor={network_name} yet; choose from: "
                          f"{sde_actors} (or algo.use_sde=false)")
    if not spec.on_policy and network_spec.recurrent and not buffer_spec.sequences:
        raise ConfigError(f"algo={algo_name} with actor={network_name} learns from stored sequences: use "
                          f"buffer=sequence (R2D2 burn-in); buffer={buffer_name} holds single transitions")
    require(isinstance(cfg.seed, int) and not isinstance(cfg.seed, bool), "seed", cfg.seed, "must be an integer")
    require(0 <= cfg.seed < 2**32, "seed", cfg.seed, "must be between 0 and 2**32 - 1 (numpy's seed range)")
    threads = cfg.get("torch_threads", 1)
    most = max_torch_threads()
    require(isinstance(threads, int) and not isinstance(threads, bool) and 0 <= threads <= most, "torch_threads",
            threads, f"must be an integer in [1, {most}] (4 per usable core of this machine; 0: torch's default, "
            "one thread per core)")
    for flag in ("deterministic", "trusted_checkpoint", "log.console", "log.tensorboard"):
        value = OmegaConf.select(cfg, flag, default=False)
        require(isinstance(value, bool), flag, value, "expected true or false")
    compile_ = cfg.get("compile", False)
    require(isinstance(compile_, bool), "compile", compile_, "expected true or false")
    rays = ray_settings(cfg)
    if rays is not None:
        check_fits(algo_cfg_flag(cfg, "use_sde"), cfg.algo.get("train_freq_unit", "step") == "episode",
                   0 if spec.on_policy else rays.max_policy_lag)
    if compile_ and not spec.compiles:
        able = [n for n in ALGOS.names() if ALGOS.spec(n).compiles]
        raise ConfigError(f"compile=true is not implemented for algo={algo_name} yet; it is for: {', '.join(able)} "
                          "(drop compile=true: eager is the default)")


def check_finite(cfg: DictConfig) -> None:
    """No setting is nan (every comparison with it is false, so range checks let it through), and no algorithm
    number is infinite (`algo.lr=inf` diverges at the first update; null, where a key takes it, means "none")."""
    for name in ("env", "actor", "algo", "buffer"):  # train's own floats: TrainSettings, with their meanings
        values = cfg.get(name)
        if not isinstance(values, DictConfig):
            continue
        for key, value in values.items():
            if isinstance(value, float) and (math.isnan(value) or (name == "algo" and math.isinf(value))):
                require(False, f"{name}.{key!s}", value, "use a finite number" + (
                    " (or null where the key takes it)" if name == "algo" else ""))


def algo_cfg_flag(cfg: DictConfig, key: str) -> bool:
    return bool(cfg.algo.get(key, False))


def _check_memory(cfg: DictConfig, obs_space: Any, act_space: Any, num_envs: int, on_policy: bool) -> None:
    """Refuse a run that surely cannot fit in memory before anything big is allocated (services/memory.py)."""
    from rlcli.services import memory

    n_steps = cfg.algo.get("n_steps", 1)
    n_steps = int(n_steps) if isinstance(n_steps, int) else 1
    obs_bytes = 1 if str(getattr(obs_space, "dtype", "")) == "uint8" else 4
    memory.check_fits(memory.estimate(cfg, obs_space, act_space, num_envs, n_steps, on_policy, obs_bytes))


def build(cfg: DictConfig, start_workers: bool = True) -> Components:
    """Check the config, then build envs, networks, algorithm, storage and collector on the run's device.
    `start_workers=False` checks collector=ray's settings without starting Ray (a sweep's pre-check of each job)."""
    check_config(cfg)
    check_tracking(cfg)
    settings = TrainSettings(**section(cfg, "train"))
    rays = ray_settings(cfg)
    if rays is not None:
        check_ray(rays)
        settings.num_envs = rays.workers * rays.envs_each(settings.num_envs)  # the run's envs: all the workers'
    device = resolve_device(cfg.device)
    configure_torch(int(cfg.get("torch_threads", 1)), bool(cfg.deterministic))
    seed_everything(cfg.seed)

    algo_cfg = algo_section(cfg)
    spec: AlgoSpec = ALGOS.spec(algo_cfg["name"])
    offline = offline_data(cfg, spec, rays is not None)
    if offline is not None:
        settings.num_envs = 1  # no training envs: the algorithm is built as for one (its acting is never used)
    env_factory: GymEnvFactory = ENVS.build(section(cfg, "env"))
    if offline is not None and offline.settings.normalize_obs:
        env_factory.normalize_obs = True  # the networks' normalizer, set from the dataset below and never updated
    masks = spec.action_masks
    if getattr(env_factory, "turn_based", False):  # env=pz with a PettingZoo AEC env (envs/turn_based.py)
        check_turn_based(env_factory.spec.id, str(algo_cfg["name"]), spec, str(cfg.actor.name))
    test_envs = env_factory.make(settings.test_episodes, settings.vector_mode, eval=True, masks=masks)
    envs = test_envs
    video_envs = None
    online = offline is None or offline.settings.online_steps > 0
    try:
        if online:  # collector=ray: the training envs live on the workers; this process keeps one for spaces
            # (a multi-agent env's one copy is a row per agent: envs/multiagent.py's copies_of)
            one_copy = 1 if getattr(env_factory, "joint", True) else int(getattr(env_factory, "n_agents", 1))
            if rays is not None and (each := settings.num_envs // rays.workers) % one_copy:  # before any worker
                named = (f"collector.envs_per_worker={each}" if rays.envs_per_worker is not None else
                         f"train.num_envs={settings.num_envs} over collector.workers={rays.workers} ({each} each)")
                raise ConfigError(f"{named}: env {env_factory.spec.id} has {one_copy} agents, one row each, so a "
                                  f"worker's envs must be a multiple of {one_copy} (a copy of the env is "
                                  f"{one_copy} rows)")
            envs = env_factory.make(settings.num_envs if rays is None else one_copy, settings.vector_mode,
                                    gamma=float(algo_cfg.get("gamma", 0.99)), masks=masks)
        video_envs = make_video_envs(cfg, env_factory, settings.vector_mode, masks)
        obs_space, act_space = envs.single_observation_space, envs.single_action_space
        if offline is None:
            _check_memory(cfg, obs_space, act_space, settings.num_envs, spec.on_policy)
        else:
            check_dataset_fits(offline, obs_space, act_space)
        try:
            agent = build_agent(cfg, env_factory, obs_space, act_space, device, settings.num_envs)
        except ConfigError as error:  # a batch size checked against the envs: say where their count came from
            unused = rays.unused_num_envs(cfg.train.num_envs) if rays is not None else None
            if unused is None or "num_envs" not in str(error):
                raise
            raise ConfigError(f"{error} ({unused})") from None
        algo, addons, carry_size, obs_dtype = agent.algo, agent.addons, agent.carry_size, agent.obs_dtype
        init_from = cfg.actor.get("init_from")
        if init_from:
            load_network_weights(algo.networks, Path(str(init_from)),
                                 trusted=bool(cfg.get("trusted_checkpoint", False)))
        buffer_cfg = section(cfg, "buffer")
        if offline is not None:  # the storage holds the dataset, exactly
            if carry_size:
                raise ConfigError(f"an offline run learns from single transitions; actor={cfg.actor.name} is "
                                  "recurrent: use actor=mlp (or another feed-forward network)")
            buffer_cfg["capacity"] = len(offline.dataset) + offline.settings.online_steps
        buffer = BUFFERS.build(
            buffer_cfg, n_steps=algo.steps_per_collect, num_envs=settings.num_envs,
            obs_shape=obs_space.shape, action_shape=act_space.shape, discrete=isinstance(act_space, Discrete),
            device=device, gamma=algo.gamma, goal=env_factory.goal,
            **({"carry_size": carry_size} if carry_size else {}),
            **({"value_size": spec.value_outputs} if spec.value_outputs > 1 else {}),
            **({"obs_dtype": obs_dtype} if obs_dtype != torch.float32 else {}),
            **({"mask_size": mask_width(act_space)} if masks else {}),
            # replay holds raw observations and normalizes each batch with the statistics of the moment
            **({} if spec.on_policy else {"normalizer": algo.networks.normalizer}),
        )
        schedule_cfg = cfg.algo.get("schedules")
        schedules = build_schedules(algo, OmegaConf.to_container(schedule_cfg) if schedule_cfg else None,  # type: ignore[arg-type]
                                    addons, buffer)
        if cfg.get("compile", False):
            from rlcli.algos.loss_step import enable_compile  # every LossStep of the algorithm, compiled

            enable_compile(algo)
        learner: Learner = OnPolicyLearner(algo, buffer) if spec.on_policy else OffPolicyLearner(algo, buffer)
        if offline is not None:
            assert isinstance(learner, OffPolicyLearner)
            steps_per_iteration = start_offline(learner, offline, act_space)
            if offline.settings.online_steps:  # the dataset and the online experience in one storage, mixed
                from rlcli.offline.replay import MixedReplay
                from rlcli.run.offline import reward_multiplier

                chosen = offline.settings
                mixed = MixedReplay(buffer, len(offline.dataset), chosen.offline_fraction,
                                    reward_multiplier(offline.dataset, chosen), chosen.offline_fraction_final,
                                    chosen.online_steps)
                learner = OffPolicyLearner(learner.algo, mixed)
        elif isinstance(learner, OffPolicyLearner):
            capacity, batch_size = learner.buffer.capacity, learner.algo.batch_size
            require(capacity >= batch_size, "buffer.capacity", capacity,
                    f"must hold at least algo.batch_size={batch_size} transitions")
    except BaseException:
        for opened in {id(e): e for e in (envs, test_envs, video_envs) if e is not None}.values():
            opened.close()
        raise
    clock = PhaseClock()
    collector: ExperienceCollector
    if offline is not None:
        collector = OfflineCollector(steps_per_iteration, offline.describe(), clock)
        if offline.settings.online_steps:
            collector = offline_then_online(collector, envs, algo, device, cfg, clock, obs_dtype, masks, offline)
            settings.total_steps += offline.settings.online_steps
    elif rays is None:
        collector = Collector(envs, algo.networks.normalizer, device, seed=cfg.seed,
                              carry_size=carry_size, clock=clock, obs_dtype=obs_dtype, masks=masks)
    else:
        try:
            collector = RayCollector(cfg, rays, settings.num_envs, algo.networks.normalizer, device, spec.on_policy,
                                     clock, start=start_workers, agent_names=find_attr(envs, "agent_names"),
                                     agent_groups=find_attr(envs, "agent_groups"))
        except BaseException:
            for made in (envs, test_envs, video_envs):
                if made is not None:
                    made.close()
            raise
    stop_reward = env_factory.reward_threshold if isinstance(settings.stop_reward, str) else settings.stop_reward
    return Components(cfg, settings, device, spec, envs, test_envs, learner, collector, schedules, addons,
                      obs_dtype, carry_size, stop_reward, video_envs, clock, offline=offline)


def offline_data(cfg: DictConfig, spec: AlgoSpec, ray: bool) -> OfflineData | None:
    """The dataset of a run with `dataset=`, read and fingerprinted, with its settings checked (None: an ordinary
    run). An offline algorithm without a dataset, or an on-policy one with it, is one line."""
    from rlcli.run import offline as offline_run

    source = offline_run.dataset_source(cfg)
    name = cfg.algo.name
    if source is None:
        if spec.offline:
            iql = (" (BenchMARL's and EPyMARL's IQL, independent Q-learning, is algo=dqn on a multi-agent env: one "
                   "Q-network shared by the agents' rows)") if name == "iql" else ""
            raise ConfigError(f"algo={name} learns from a dataset only: give dataset=<a dataset's path or Minari id>; "
                              f"{MAKE_ONE}{iql}")
        return None
    if spec.on_policy:
        able = [n for n in ALGOS.names() if not ALGOS.spec(n).on_policy]
        raise ConfigError(f"algo={name} is on-policy and cannot learn from dataset={source!r}; choose from: "
                          f"{', '.join(able)}")
    require(not ray, "collector", cfg.collector.name, "an offline run steps no env: use collector=local")
    offline_settings = offline_run.settings_of(cfg)
    offline_run.check_env_settings(cfg)
    dataset = offline_run.read(source)
    offline_run.check_env(dataset, source, str(cfg.env.id))
    return OfflineData(source, dataset, offline_run.fingerprint(dataset), offline_settings)


def offline_then_online(offline_collector: OfflineCollector, envs: VectorEnv, algo: Any, device: torch.device,
                        cfg: DictConfig, clock: PhaseClock, obs_dtype: torch.dtype, masks: bool,
                        offline: OfflineData) -> ExperienceCollector:
    """offline.online_steps: the offline collector until train.total_steps, then one training env stepped by the
    ordinary collector (with offline.normalize_obs, the dataset's statistics stay frozen)."""
    from typing import cast

    from rlcli.actors.normalizer import RunningNorm
    from rlcli.collectors.offline import FrozenNorm, OfflineThenOnline

    normalizer = algo.networks.normalizer
    if offline.settings.normalize_obs:
        normalizer = cast(RunningNorm, FrozenNorm(normalizer))
    online = Collector(envs, normalizer, device, seed=cfg.seed, clock=clock, obs_dtype=obs_dtype, masks=masks)
    return OfflineThenOnline(offline_collector, online, int(cfg.train.total_steps))


def check_dataset_fits(offline: OfflineData, obs_space: Any, act_space: Any) -> None:
    """The dataset's observations and actions fit the env it is tested in (offline/checks.py), in one line."""
    from rlcli.offline.checks import check_against_env

    check_against_env(offline.dataset, obs_space, act_space)


def start_offline(learner: OffPolicyLearner, offline: OfflineData, act_space: Any) -> int:
    """Fill the learner's storage with the dataset (rewards scaled, observation statistics frozen into the
    networks when asked) and return the gradient steps of one loop iteration. Learning starts at once: the dataset
    is the warm-up that `algo.learning_starts` gives an online run."""
    from rlcli.offline.replay import fill_replay
    from rlcli.run.offline import observation_moments, reward_multiplier

    algo, data = learner.algo, offline.dataset
    steps = int(getattr(algo, "gradient_steps", 1))
    require(steps != 0, "algo.gradient_steps", steps, "must be >= 1 in an offline run (train.total_steps counts "
            "gradient steps)")
    if steps < 0:  # -1: one gradient step per step the collector reports
        steps = int(algo.steps_per_collect)
    algo.learning_starts = 0
    if offline.settings.normalize_obs:
        mean, var = observation_moments(data)
        normalizer = algo.networks.normalizer
        normalizer.mean.copy_(torch.as_tensor(mean))
        normalizer.var.copy_(torch.as_tensor(var))
        normalizer.count.fill_(float(len(data)))
    try:
        fill_replay(learner.buffer, data, act_space, reward_factor=reward_multiplier(data, offline.settings))  # type: ignore[arg-type]
    except ValueError as error:
        raise ConfigError(f"dataset={offline.source!r}: {error} (use buffer=replay)") from None
    return steps


def make_video_envs(cfg: DictConfig, env_factory: GymEnvFactory, vector_mode: VectorMode,
                    masks: bool = False) -> VectorEnv | None:
    """The env that log.video_every records in: checked (encoder installed, env renders) before training starts."""
    from rlcli.services import video

    every, fmt = cfg.log.get("video_every", 0), str(cfg.log.get("video_format", "mp4"))
    require(isinstance(every, int) and every >= 0, "log.video_every", every, "must be an integer >= 0 (0 = no videos)")
    if not every:
        return None
    video.require_encoder(fmt, "log.video_format")
    envs = env_factory.make(1, vector_mode, eval=True, render=True, masks=masks)
    video.check_draws(envs, f"log.video_every={every}")
    return envs
