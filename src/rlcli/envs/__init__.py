"""Vector environments from config.

All vector envs use gymnasium's default NEXT_STEP autoreset (the only mode its numpy-vectorized
envs offer): the step that ends an episode returns the true final observation, and the next step of
that sub-env is a reset step whose action is ignored. The collector relies on exactly that.
"""

from __future__ import annotations

import importlib
import os
import traceback
from collections.abc import Callable
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from rlcli.envs import (  # noqa: F401  (register the shipped envs)
    bit_flipping,
    image_and_flag,
    match_digits,
    memory_cue,
    multiagent,
    pixel_goal,
    slow_step,
    valid_moves,
    vmas,
)
from rlcli.envs.dict_obs import has_images, pack_dict_observations
from rlcli.envs.goals import GoalLayout, goal_layout
from rlcli.envs.image import image_wrappers
from rlcli.envs.masks import ActionMaskInInfo
from rlcli.envs.multiagent import ParallelEnvSpec, pettingzoo_kind
from rlcli.envs.wrappers import SparseReward, TimeFeature, one_hot_encodable, one_hot_observations
from rlcli.registry import ENVS, ConfigError, did_you_mean, require

VectorMode = Literal["auto", "sync", "async", "numpy", "envpool"]


PYTHON_ENV_PREFIX = "rlcli-python/"  # rlcli.train(env=<function>) registers the function's env under this prefix


PYTHON_MADE = "rlcli.envs.python_made:"  # rlcli.train(env=<a function that makes a PettingZoo env>): env=pz's id


def python_env_function(env_id: str) -> str:
    """The name to show for the function behind `rlcli-python/<name>-v0` or `rlcli.envs.python_made:<name>` (a
    lambda's id says only `env`)."""
    name = env_id.removeprefix(PYTHON_ENV_PREFIX).removesuffix("-v0").removeprefix(PYTHON_MADE)
    if name.endswith("_instance"):  # rlcli.train(env=<an instance>): copies of it
        return f"<a {name.removesuffix('_instance')} instance>"
    return "<the function that made the env>" if name == "env" else name


def python_env_missing(env_id: str, load: str = "<run dir or file>", resume: str = "<run dir>") -> str:
    """Why a run trained on a Python function's env cannot be rebuilt here, and the two calls that rebuild it: the
    function lives only in the process that trained the run, so the id alone names nothing in a new one."""
    fn = python_env_function(env_id)
    return (f"env.id={env_id!r} is the env of a Python function ({fn}) that only the process that trained this run "
            f"had; pass that function again from Python: rlcli.load({load}, env={fn}) to act with the policy, "
            f"rlcli.train(resume={resume}, env={fn}) to continue training (rl-train and rl-eval cannot make it)")


def python_env_unknown(env_id: Any) -> bool:
    """An env of `rlcli.train(env=<function>)` that this process does not have (the run was trained in another)."""
    if not isinstance(env_id, str):
        return False
    if env_id.startswith(PYTHON_ENV_PREFIX):
        return env_id not in gym.registry
    if env_id.startswith(PYTHON_MADE):
        from rlcli.envs import python_made

        return env_id.removeprefix(PYTHON_MADE) not in python_made.MAKERS
    return False


def resolve_env_id(env_id: str | None) -> gym.envs.registration.EnvSpec | ParallelEnvSpec:
    """Look a gymnasium id up (importing `module` first for `module:Env-v0`), or fail in one line. A PettingZoo
    Parallel or AEC env's id (env=pz: a module with parallel_env(), or env(), or module:function) gives its
    ParallelEnvSpec."""
    if python_env_unknown(env_id):
        raise ConfigError(python_env_missing(str(env_id)))
    if env_id and env_id not in gym.registry and pettingzoo_kind(env_id):
        return ParallelEnvSpec(env_id, env_id)
    if not env_id:
        raise ConfigError("env.id is not set; use env=<shipped id> or env=gym env.id=<gymnasium id>")
    if env_id.startswith("ALE/") and env_id not in gym.registry:
        try:
            import ale_py
        except ImportError:
            raise ConfigError(f"env.id={env_id!r} needs the Atari emulator: pip install -e '.[atari]' "
                              "(ale-py, which ships the ROMs, and opencv for the preprocessing)") from None
        gym.register_envs(ale_py)
    if ":" in env_id:
        module, _, _ = env_id.partition(":")
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ConfigError(f"env.id={env_id!r}: cannot import module '{module}' ({e})") from None
        except Exception as e:  # the user's module failed while it ran (a bug, a bad relative name): one line
            frames = [f for f in traceback.extract_tb(e.__traceback__)  # the module's own line, not importlib's
                      if not f.filename.startswith("<") and "importlib" not in f.filename and f.filename != __file__]
            where = f" ({os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
            detail = (str(e).strip().splitlines() or [""])[-1]
            raise ConfigError(f"env.id={env_id!r}: importing module '{module}' raised {type(e).__name__}"
                              f"{': ' + detail if detail else ''}{where}") from None
        env_id = env_id.split(":", 1)[1]
    if env_id not in gym.registry:
        if env_id.startswith(PYTHON_ENV_PREFIX):
            raise ConfigError(python_env_missing(env_id))
        ids = sorted(gym.registry)
        raise ConfigError(
            f"env.id={env_id!r} is not a registered gymnasium id{did_you_mean(env_id, ids)}; "
            "see gymnasium.pprint_registry() for the list"
        )
    return gym.spec(env_id)


@ENVS.register("gym")
class GymEnvFactory:
    """Settings for one gymnasium env id; `make()` builds a wrapped vector env from them.

    Observation normalization is not an env wrapper here: `normalize_obs` and `clip_obs` are read
    by the trainer and live inside the agent, so test envs and checkpoints see the same statistics.
    """

    def __init__(
        self,
        id: str | None,
        kwargs: dict[str, Any] | None = None,
        max_episode_steps: int | None = None,
        normalize_obs: bool = False,
        clip_obs: float = 10.0,
        normalize_reward: bool = False,
        clip_reward: float | None = None,
        observation_indices: list[int] | None = None,
        sparse_reward: bool = False,
        atari: bool = False,
        frame_stack: int = 1,
        time_feature: bool = False,
        frame_skip: int = 1,
        resize: list[int] | None = None,
        grayscale: bool = False,
        critic_state: bool = False,
        joint: bool = False,
    ) -> None:
        spec = resolve_env_id(id)
        if isinstance(spec, ParallelEnvSpec):
            raise ConfigError(f"env.id={id!r} is a PettingZoo {pettingzoo_kind(str(id))} env (many agents); use env=pz "
                              f"env.id={id}")
        if critic_state:  # set by algo=mappo
            raise ConfigError(f"env.critic_state=true (algo=mappo's centralized critic) needs a multi-agent env; "
                              f"env {id} has one agent: use algo=ppo, or env=pz (e.g. env=simple_spread_v3)")
        if joint:  # set by algo=vdn, qmix, masac and maddpg
            raise ConfigError(f"env.joint=true (algo=vdn, qmix, masac, maddpg: a team's joint transitions) needs a "
                              f"multi-agent env; env {id} has one agent: use a single-agent algorithm (algo=dqn for "
                              "Discrete actions, sac or ddpg for Box ones), or a multi-agent env (env=coop_match for "
                              "vdn, qmix; env=coop_reach for masac, maddpg; env=simple_spread_v3)")
        self.spec = spec
        if "mujoco" in str(self.spec.entry_point):  # its deprecation warnings: once, to train.log (library_noise.py)
            from rlcli.envs.library_noise import quiet_mujoco

            quiet_mujoco()
        self.observation_indices = None if observation_indices is None else [int(i) for i in observation_indices]
        self.id = id
        self.kwargs = dict(kwargs or {})
        if max_episode_steps is not None:
            require(max_episode_steps > 0, "env.max_episode_steps", max_episode_steps, "must be > 0 or null")
            self.kwargs["max_episode_steps"] = max_episode_steps
        require(clip_obs > 0, "env.clip_obs", clip_obs, "must be > 0")
        require(clip_reward is None or clip_reward > 0, "env.clip_reward", clip_reward, "must be > 0 or null")
        self.normalize_obs = normalize_obs
        self.clip_obs = clip_obs
        self.goal: GoalLayout | None = None  # set by make() for goal-conditioned envs
        self.normalize_reward = normalize_reward
        self.clip_reward = clip_reward
        self.sparse_reward = sparse_reward
        require(frame_stack >= 1, "env.frame_stack", frame_stack, "must be >= 1 (1 = no stacking)")
        self.atari, self.frame_stack = atari, frame_stack
        require(frame_skip >= 1, "env.frame_skip", frame_skip, "must be >= 1 (1 = every frame)")
        self.frame_skip, self.resize, self.grayscale = frame_skip, resize, grayscale
        if atari and (frame_skip > 1 or resize is not None or grayscale):
            raise ConfigError("env.atari=true already skips 4 frames and makes 84 x 84 gray images; drop "
                              "env.frame_skip, env.resize and env.grayscale")
        self.time_feature = time_feature
        if atari:
            if not self.spec.id.startswith("ALE/"):
                raise ConfigError(f"env.atari=true applies gymnasium's Atari preprocessing, which needs an ALE/... "
                                  f"env id; env.id={self.spec.id!r}")
            try:
                import cv2  # noqa: F401  (AtariPreprocessing resizes frames with it)
            except ImportError:
                raise ConfigError("env.atari=true needs opencv: pip install -e '.[atari]'") from None
            self.kwargs.setdefault("frameskip", 1)  # the preprocessing skips frames itself

    def _keep_observations(self, envs: VectorEnv) -> VectorEnv:
        """`env.observation_indices=[0,2]`: keep only these entries of a flat Box observation (hide the
        rest, e.g. CartPole's velocities, to make a task partially observed)."""
        space, keep = envs.single_observation_space, self.observation_indices
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            raise ConfigError(f"env.observation_indices needs a flat Box observation; {self.spec.id} has {space}")
        bad = [i for i in keep if not -space.shape[0] <= i < space.shape[0]]
        if bad or not keep:
            raise ConfigError(f"env.observation_indices={keep}: indices must be in [0, {space.shape[0] - 1}] "
                              f"for {self.spec.id}'s {space.shape[0]} observation entries")
        return gym.wrappers.vector.TransformObservation(
            envs, lambda obs: obs[..., keep], observation_space=_select_box(envs.observation_space, keep),
            single_observation_space=_select_box(space, keep))

    def _env_wrappers(self, masks: bool = False) -> list[Callable[[gym.Env], gym.Env]]:
        """Per-env wrappers: valid-action masks into info (for algorithms that read them), Atari
        preprocessing (no-op starts, 4-frame skip with max-pooling, 84 x 84 grayscale; episodes end with
        the game, not with a lost life), other images' frame skip / resize / gray scale (image.py), and frame
        stacking."""
        wrappers: list[Callable[[gym.Env], gym.Env]] = []
        if masks:
            wrappers.append(lambda env: ActionMaskInInfo(env, self.spec.id))
        if self.atari:
            wrappers.append(lambda env: gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4,
                                                                          screen_size=84, grayscale_obs=True))
        wrappers += image_wrappers(self.spec.id, self.frame_skip, self.resize, self.grayscale, self.frame_stack)
        if self.time_feature:
            wrappers.append(TimeFeature)
        return wrappers

    @property
    def reward_threshold(self) -> float | None:
        """The registered one; with `sparse_reward`, 1.0 (every test episode reached its goal)."""
        return 1.0 if self.sparse_reward else self.spec.reward_threshold

    def make(
        self, num_envs: int, mode: VectorMode = "auto", *, gamma: float = 0.99, eval: bool = False,
        render: bool = False, masks: bool = False,
    ) -> VectorEnv:
        """A vector env with episode statistics; training envs also get reward scaling / clipping.
        `render`: sub-envs that render rgb_array frames (for videos; one process). `masks`: every info
        carries the valid-action mask (envs/masks.py)."""
        try:
            if render:
                return self._make_rendering(num_envs, mode, masks)
            return self._make(num_envs, mode, gamma=gamma, eval=eval, masks=masks)
        except (gym.error.DependencyNotInstalled, ModuleNotFoundError) as error:
            raise ConfigError(missing_dependency(self.spec, error)) from None
        except (TypeError, ValueError) as error:  # the env's constructor refused env.kwargs
            if isinstance(error, ConfigError):
                raise
            detail = (str(error).strip().splitlines() or [type(error).__name__])[-1]
            raise ConfigError(f"env {self.spec.id} refused env.kwargs={self.kwargs}: {detail}") from None

    def _make_rendering(self, num_envs: int, mode: VectorMode, masks: bool) -> VectorEnv:
        """Test envs that also render rgb_array frames: the same vector mode as `mode` when its env can
        render (so episode i is the same episode as in a test phase), else one process of sync envs."""
        entry = self.spec.entry_point
        creator = gym.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry
        modes = list(getattr(creator, "metadata", {}).get("render_modes", []))
        if "rgb_array" not in modes:
            raise ConfigError(f"env {self.spec.id} cannot render frames for a video (its render modes: "
                              f"{', '.join(modes) or 'none'}); choose an env that renders rgb_array")
        vector = self.spec.vector_entry_point
        if mode == "envpool":  # EnvPool does not render: videos come from gymnasium's own env
            mode = "sync"
        if mode in ("auto", "numpy") and vector is not None:
            creator = gym.envs.registration.load_env_creator(vector) if isinstance(vector, str) else vector
            if "rgb_array" not in getattr(creator, "metadata", {}).get("render_modes", []):
                mode = "sync"
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # pygame draws off-screen: no display, no warning
        self.kwargs["render_mode"] = "rgb_array"
        try:
            return self._make(num_envs, mode, gamma=0.99, eval=True, masks=masks)
        finally:
            del self.kwargs["render_mode"]

    def _make(self, num_envs: int, mode: VectorMode, *, gamma: float, eval: bool, masks: bool = False) -> VectorEnv:
        envs = self._make_envpool(num_envs, masks) if mode == "envpool" else self._make_gymnasium(num_envs, mode, masks)
        if envs.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP) != AutoresetMode.NEXT_STEP:
            raise ConfigError(f"env {self.spec.id}: rlcli needs NEXT_STEP autoreset vector envs")
        if self.sparse_reward:
            envs = SparseReward(envs)
        envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)  # raw returns, before any scaling
        if not eval:
            self.goal = goal_layout(envs)
        if has_images(envs.single_observation_space):  # images stay uint8: packed, for actor=combined
            envs = pack_dict_observations(envs, self.spec.id)
        elif isinstance(envs.single_observation_space, gym.spaces.Dict):
            envs = gym.wrappers.vector.FlattenObservation(envs)
        if one_hot_encodable(envs.single_observation_space):
            envs = one_hot_observations(envs)
        elif not isinstance(envs.single_observation_space, gym.spaces.Box):
            space = envs.single_observation_space
            envs.close()
            raise ConfigError(f"env {self.spec.id} has {space} observations; rlcli takes Box ones, Discrete / "
                              "MultiDiscrete ones and tuples of Discrete (one-hot encoded) and Dict ones (flattened): "
                              "wrap it in gymnasium.wrappers.TransformObservation to one of those in your own module")
        if self.observation_indices is not None:
            envs = self._keep_observations(envs)
        if not eval:
            if self.normalize_reward:
                envs = gym.wrappers.vector.NormalizeReward(envs, gamma=gamma)
            if self.clip_reward is not None:
                envs = gym.wrappers.vector.ClipReward(envs, -self.clip_reward, self.clip_reward)
        return envs

    def _make_gymnasium(self, num_envs: int, mode: VectorMode, masks: bool) -> VectorEnv:
        wrappers = self._env_wrappers(masks)
        if mode == "auto":
            mode = "numpy" if self.spec.vector_entry_point is not None and not wrappers else "sync"
        if mode == "numpy":
            if self.spec.vector_entry_point is None or wrappers:
                raise ConfigError(
                    f"train.vector_mode=numpy: {self.spec.id} has no numpy-vectorized version (or per-env wrappers "
                    "such as env.atari / env.frame_stack / action masks are on); choose from: auto, sync, async"
                )
            return gym.make_vec(self.spec.id, num_envs, vectorization_mode="vector_entry_point", **self.kwargs)
        return gym.make_vec(self.spec.id, num_envs, vectorization_mode=mode,
                            vector_kwargs={"autoreset_mode": AutoresetMode.NEXT_STEP}, wrappers=wrappers, **self.kwargs)

    def _make_envpool(self, num_envs: int, masks: bool) -> VectorEnv:
        if masks:
            raise ConfigError("train.vector_mode=envpool does not pass valid-action masks; use "
                              "train.vector_mode=auto with this algorithm")
        if self.time_feature:
            raise ConfigError("train.vector_mode=envpool has no time feature (env.time_feature=true); use "
                              "train.vector_mode=auto")
        if self.frame_skip > 1 or self.resize is not None or self.grayscale:
            raise ConfigError("train.vector_mode=envpool does not apply env.frame_skip / env.resize / env.grayscale; "
                              "use train.vector_mode=auto")
        from rlcli.envs.envpool_vector import make_envpool

        kwargs = dict(self.kwargs)
        return make_envpool(self.spec.id, num_envs, atari=self.atari, frame_stack=self.frame_stack,
                            max_episode_steps=kwargs.pop("max_episode_steps", None), kwargs=kwargs)


# gymnasium's env families that need packages of their own: what to install
EXTRAS = {"gymnasium.envs.box2d": "the Box2D physics engine: pip install -e '.[box2d]'",
          "gymnasium.envs.mujoco": "the MuJoCo simulator: pip install -e '.[mujoco]'",
          "ale_py": "the Atari emulator: pip install -e '.[atari]'"}


def missing_dependency(spec: gym.envs.registration.EnvSpec, error: Exception) -> str:
    """One line for an env whose package is missing: what it needs and the pip command."""
    entry = spec.entry_point if isinstance(spec.entry_point, str) else ""
    for prefix, advice in EXTRAS.items():
        if entry.startswith(prefix):
            return f"env {spec.id} needs {advice}"
    detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return f"env {spec.id} needs a package that is not installed: {detail}"


def _select_box(space: gym.spaces.Box, keep: list[int]) -> gym.spaces.Box:
    return gym.spaces.Box(space.low[..., keep], space.high[..., keep], dtype=space.dtype)


def finished_episodes(infos: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Returns and lengths of the episodes that ended in this step (from RecordEpisodeStatistics)."""
    if "_episode" not in infos:
        return np.empty(0), np.empty(0)
    mask = infos["_episode"]
    return infos["episode"]["r"][mask], infos["episode"]["l"][mask]
