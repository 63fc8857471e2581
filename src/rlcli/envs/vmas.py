"""VMAS scenarios as one gymnasium VectorEnv with a row per agent (`env=vmas env.scenario=balance`).

VMAS (pip install -e '.[vmas]') simulates M copies of a multi-agent scenario as one batched torch env. Its copies
become rows as env=pz's do (envs/multiagent.py, whose AgentRowsEnv is the layout both share): copy c's agent i at
row c * N + i with its one-hot index, the joint observation appended for MAPPO's critic (VMAS has no global state),
or in joint mode (`env.joint=true`: vdn, qmix, masac, maddpg) one row per copy; team-sum episode returns on each
copy's first row, each agent's under `agent_episode`. All M copies advance in one VMAS step; a copy whose episode
ended is reset (VMAS's `reset_at`) at its next step, gymnasium's NEXT_STEP autoreset.

An episode ends by termination when the scenario says it is done, by truncation after `env.max_steps` steps (VMAS
scenarios mostly never end: BenchMARL's 100 steps by default); every agent of a copy ends together. VMAS runs on
`env.device` (the run's device by default: numbers cross to numpy each step, as a gymnasium vector env's do).

Exact resume: the env's own random state (VMAS draws its randomness from a state it swaps in around each call; each
vector env here keeps its own, seeded by reset(seed)) and every tensor and number in the scenario's world are saved
with the run (`capture_state` / `restore_state`, which envs/state.py calls), and written back into the rebuilt env.
"""

from __future__ import annotations

import difflib
import importlib
import warnings
from typing import TYPE_CHECKING, Any

from gymnasium.vector import VectorEnv

from rlcli.envs.multiagent import ParallelEnvSpec, attach_parameter_layout, check_separate_params, copies_of
from rlcli.registry import ENVS, ConfigError, require

if TYPE_CHECKING:
    from rlcli.envs.vmas_rows import VmasVectorEnv


def import_vmas() -> Any:
    """The vmas package (it imports the old `gym`, which warns at import), or a one-line error."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return importlib.import_module("vmas")
    except ImportError as error:
        raise ConfigError(f"env=vmas needs VMAS: pip install -e '.[vmas]' ({error})") from None


def scenario_names(vmas: Any) -> list[str]:
    """VMAS's scenarios, its MPE ports and its debug scenarios."""
    return sorted({*vmas.scenarios, *getattr(vmas, "mpe_scenarios", []), *getattr(vmas, "debug_scenarios", [])})


# make_env's own keywords: where rlcli sets each (None: rlcli decides it, the layout depends on it)
MAKE_ENV_KEYS: dict[str, str | None] = {
    "max_steps": "env.max_steps (a truncation; VMAS's own would end episodes as terminated)",
    "continuous_actions": "env.continuous_actions", "device": "env.device", "seed": "seed=",
    "num_envs": "train.num_envs (rows) or train.test_episodes", "terminated_truncated": None,
    "dict_spaces": None, "multidiscrete_actions": None, "clamp_actions": None, "grad_enabled": None,
    "wrapper": None, "wrapper_kwargs": None, "scenario": "env.scenario"}


@ENVS.register("vmas")
class VmasEnvFactory:
    """Settings for a VMAS scenario; `make()` builds a VmasVectorEnv of its copies (one batched VMAS env).

    As env=pz: training envs' `num_envs` (train.num_envs) counts rows, a multiple of the group's agents (joint mode:
    copies); test envs' `num_envs` (train.test_episodes) counts copies, each one test episode."""

    def __init__(self, scenario: str | None = None, id: str | None = None, kwargs: dict[str, Any] | None = None,
                 max_steps: int | None = 100,
                 continuous_actions: bool = True, device: str = "cpu", agents: list[str] | None = None,
                 agent_id: bool = True, critic_state: bool = False, joint: bool = False, share_params: bool = True,
                 normalize_obs: bool = False, clip_obs: float = 10.0, reward_threshold: float | None = None,
                 groups: Any = None) -> None:
        self.vmas_module = import_vmas()
        names = scenario_names(self.vmas_module)
        if not scenario or str(scenario) not in names:
            close = difflib.get_close_matches(str(scenario), names, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"env.scenario={scenario!r} is not a VMAS scenario{hint}; choose from: "
                              f"{', '.join(names)}")
        if max_steps is not None:
            require(int(max_steps) > 0, "env.max_steps", max_steps, "must be > 0 (or null: no time limit)")
        require(clip_obs > 0, "env.clip_obs", clip_obs, "must be > 0")
        from rlcli.services.runtime import resolve_device

        try:
            self.device = resolve_device(str(device))
        except ConfigError as error:  # a run trained on a GPU, evaluated where there is none
            raise ConfigError(f"env.device (where VMAS simulates): {error} (or give env.device=cpu)") from None
        self.scenario = str(scenario)
        self.id = f"vmas/{scenario}" if id is None else str(id)  # a label: env.scenario picks the scenario
        self.kwargs = dict(kwargs or {})
        owned = sorted(set(self.kwargs) & set(MAKE_ENV_KEYS))
        if owned:  # VMAS's own time limit would come back as `done` (terminated), its other keys break the layout
            key = owned[0]
            setting = MAKE_ENV_KEYS[key]
            raise ConfigError(f"env.kwargs.{key}: {key} is a setting of VMAS's make_env, not of the scenario; "
                              + (f"use {setting}" if setting else "rlcli sets it itself")
                              + f" (env.kwargs goes to env.scenario={scenario}'s make_world)")
        self.max_steps = None if max_steps is None else int(max_steps)
        self.continuous_actions = bool(continuous_actions)
        self.agents = None if agents is None else [str(a) for a in agents]
        self.agent_id, self.critic_state, self.joint = agent_id, critic_state, joint
        self.share_params, self.groups = share_params, groups
        check_separate_params(share_params, joint, agent_id)
        self.normalize_obs, self.clip_obs = normalize_obs, clip_obs
        self.goal = None
        self.turn_based = self.turn_masks = False
        self.spec = ParallelEnvSpec(self.id, "vmas", reward_threshold)
        probe = self._copies(1)  # checks the scenario's kwargs, agents and spaces now, before any run state exists
        self.n_agents = probe.n_agents
        sizes = probe.action_sizes
        probe.close()
        if sizes is not None:  # rows of different action sizes need masks, which env=vmas does not pass
            raise ConfigError(f"env=vmas env.scenario={self.scenario}: its learners choose among different numbers "
                              f"of Discrete actions ({', '.join(map(str, sizes))}), which env=vmas cannot mask to "
                              "each one's own; use env.continuous_actions=true, or env.agents=[...] with equal action "
                              "spaces")

    @property
    def reward_threshold(self) -> float | None:
        """env.reward_threshold: a team return (the sum over the group's agents) that stops the run."""
        return self.spec.reward_threshold

    def _copies(self, count: int) -> VmasVectorEnv:
        from rlcli.envs.vmas_rows import VmasVectorEnv  # torch: imported only when an env is made

        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                env = self.vmas_module.make_env(self.scenario, num_envs=count, device=self.device,
                                                continuous_actions=self.continuous_actions, clamp_actions=True,
                                                **self.kwargs)
        except Exception as error:  # noqa: BLE001  (a scenario refusing a value raises what it likes)
            detail = (str(error).strip().splitlines() or [type(error).__name__])[-1]
            raise ConfigError(f"env=vmas env.scenario={self.scenario} refused env.kwargs={self.kwargs}: "
                              f"{detail}") from None
        unused = [str(w.message) for w in caught if "not used by the scenario" in str(w.message)]
        if unused:
            raise ConfigError(f"env.kwargs={self.kwargs}: VMAS says {unused[0].split(' This will')[0]} "
                              f"(the keys env.scenario={self.scenario} takes are in its make_world)")
        vec = VmasVectorEnv(env, self.id, self.agents, self.agent_id, self.critic_state, self.joint, self.max_steps)
        attach_parameter_layout(vec, self.share_params, self.groups)
        return vec

    def make(self, num_envs: int, mode: str = "auto", *, gamma: float = 0.99, eval: bool = False,
             render: bool = False, masks: bool = False) -> VectorEnv:
        """Training envs: `num_envs` rows (num_envs / agents copies; joint mode: `num_envs` copies); test envs
        (`eval`): `num_envs` copies."""
        if masks:
            raise ConfigError(f"env {self.id}: env=vmas passes no valid-action masks; use algo=ppo, ippo or mappo")
        if mode not in ("auto", "sync"):
            raise ConfigError(f"train.vector_mode={mode}: env=vmas steps its copies as one batched VMAS env in this "
                              "process; choose from: auto, sync")
        if eval:
            return self._copies(num_envs)
        return self._copies(copies_of(num_envs, self.n_agents, self.joint, self.id))
