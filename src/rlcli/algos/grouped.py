"""Each group of agents its own on-policy algorithm (`algo.groups`, issue 58): the groups of env.groups collect one
rollout together, row by row, and each group's algorithm learns from its own agents' rows alone.

    rl-train algo=ippo env=simple_tag_v3 env.groups=prefix algo.groups.adversary.lr=1e-3 \\
        algo.groups.agent.name=a2c

`algo.groups.<group>` holds what that group's algorithm changes from the run's `algo`: its settings (lr, ent_coef,
clip_range, gamma, n_epochs, ...) or another on-policy algorithm (`name: a2c`), which then starts from that
algorithm's own defaults and the run's n_steps and gamma; and under `actor`, what its network changes from the run's
`actor` (`algo.groups.agent.actor.hidden_sizes=[32,32]`). A group not named there runs `algo` as it is. What the
groups share is the loop: one rollout of `algo.n_steps` steps (so every group's n_steps is the run's), the one
observation normalizer the collector updates, and the env's action space.

Each group's algorithm is the registered one, built as a run of it would be, on a network of its own (or, where the
group's agents do not share parameters, one per agent: actors/per_agent.py); its update is that algorithm's update on
its columns of the rollout (`RolloutBuffer.columns`), its GAE with its own gamma and lambda, its own optimizer and
minibatches. So a group's update is its algorithm's update on those columns alone, and nothing of one group's loss
reaches another's weights; what the groups do share is the rollout's random stream (each group's policy samples
every row) and, with env.normalize_obs, observation statistics gathered from every row. Acting computes every
group's policy on every row and keeps each row's own (a gather, as the per-agent copies do), which keeps act free
of data-dependent shapes for export.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from rlcli.actors.per_agent import agent_index, pick
from rlcli.contracts import ActOutput, AlgoSpec, RecurrentState, RolloutStorage, RunClock
from rlcli.envs.multiagent import AgentGroups, SeparateAgents
from rlcli.registry import ACTORS, ALGOS, ConfigError, defaults_of, did_you_mean
from rlcli.schedules import Schedule

# the settings a group on another algorithm takes from the run's: the loop's length and the discount
SHARED_SETTINGS = ("n_steps", "gamma")
ALGO_CONTEXT = ("networks", "num_envs", "policy_addons")  # what the build hands an algorithm besides its settings


def group_layout(obs_space: gym.spaces.Space[Any]) -> AgentGroups:
    """The env's groups (envs/multiagent.py), or one line saying what algo.groups needs."""
    layout = getattr(obs_space, "group_layout", None)
    if not isinstance(layout, AgentGroups):
        raise ConfigError("algo.groups gives each group of env.groups an algorithm of its own: it needs a "
                          "multi-agent env (env=pz, env=vmas) with env.groups set, env.agent_id=true and "
                          "env.joint=false")
    return layout


def group_settings(base: Mapping[str, Any], groups: Mapping[str, Any], layout: AgentGroups,
                   ) -> dict[str, dict[str, Any]]:
    """Each group's algo section: the run's `algo` with the group's changes on top, or for a group on another
    algorithm (`name`), that algorithm's defaults with the run's n_steps and gamma; one line for a group env.groups
    lacks or an algorithm that cannot share the run's loop."""
    if not isinstance(groups, Mapping):
        raise ConfigError(f"algo.groups={groups!r}: a mapping {{group: {{setting: value}}}} (e.g. "
                          f"algo.groups.{layout.names[0]}.lr=1e-3)")
    for group, changes in groups.items():
        if str(group) not in layout.names:
            raise ConfigError(f"algo.groups.{group}: env.groups has no group {str(group)!r}; its groups: "
                              f"{', '.join(layout.names)}")
        if not isinstance(changes, Mapping):
            raise ConfigError(f"algo.groups.{group}={changes!r}: a mapping of the group's settings (e.g. "
                              f"algo.groups.{group}.lr=1e-3, algo.groups.{group}.name=a2c)")
    base_spec: AlgoSpec = ALGOS.spec(str(base["name"]))
    settings = {}
    for group in layout.names:
        changes = dict(groups.get(group) or {})
        name = str(changes.get("name", base["name"]))
        if name == base["name"]:
            own = {**base, **changes}
        else:
            spec = ALGOS.spec(name) if name in ALGOS.names() else None
            if spec is None or not shares_rollout(spec, base_spec):
                raise ConfigError(f"algo.groups.{group}.name={name}: a group's algorithm shares the run's rollout "
                                  f"(algo={base['name']}), so it is an on-policy actor-critic one with the same use of "
                                  f"action masks; choose from: {', '.join(loop_partners(base_spec))}"
                                  f"{did_you_mean(name, loop_partners(base_spec)) if spec is None else ''}")
            defaults = defaults_of(ALGOS.get(name), ALGO_CONTEXT)
            own = {**defaults, **{k: base[k] for k in SHARED_SETTINGS if k in defaults and k in base},
                   "name": name, **changes}
        if own.get("n_steps") != base.get("n_steps"):
            raise ConfigError(f"algo.groups.{group}.n_steps={own.get('n_steps')}: the groups collect one rollout, "
                              f"so each group's n_steps is the run's algo.n_steps={base.get('n_steps')}")
        settings[group] = own
    return settings


def shares_rollout(spec: AlgoSpec, run: AlgoSpec) -> bool:
    """Whether an algorithm can learn a group's part of a run's rollout: an on-policy actor-critic on the rollout's
    GAE, taking action masks where the run's does."""
    return spec.on_policy and spec.heads == "actor_critic" and spec.rollout_returns and \
        spec.action_masks == run.action_masks


def loop_partners(spec: AlgoSpec) -> list[str]:
    """The algorithms a group may run beside a run of `spec`'s."""
    return [name for name in ALGOS.names() if shares_rollout(ALGOS.spec(name), spec)]


def group_space(obs_space: gym.spaces.Space[Any], layout: AgentGroups, group: int) -> gym.spaces.Space[Any]:
    """The observation space a group's network is built for: the rows' own, with one copy per agent of the group
    where its agents do not share parameters (the other groups' agents route to copy 0, whose rows never reach it)."""
    space = copy.copy(obs_space)
    separate: SeparateAgents | None = None
    if layout.separate[group]:
        members = layout.agents_of(group)
        copy_of = tuple(members.index(i) if i in members else 0 for i in range(layout.n_agents))
        separate = SeparateAgents(layout.n_agents, layout.id_start, False, copy_of)
    space.separate_agents = separate  # type: ignore[attr-defined]
    return space


def share_normalizer(networks: nn.Module, normalizer: nn.Module) -> None:
    """One set of observation statistics for every group: the one the collector updates."""
    for net in getattr(networks, "members", [networks]):
        net.normalizer = normalizer


class GroupNetworks(nn.Module):
    """Every group's networks under `groups.<name>.` (one module, as checkpoints, export and rl-eval take it)."""

    def __init__(self, networks: Mapping[str, nn.Module]) -> None:
        super().__init__()
        self.groups = nn.ModuleDict(dict(networks))
        first: Any = next(iter(networks.values()))
        for net in list(networks.values())[1:]:
            share_normalizer(net, first.normalizer)

    @property
    def normalizer(self) -> nn.Module:
        first: Any = next(iter(self.groups.values()))
        normalizer: nn.Module = first.normalizer
        return normalizer


class GroupedOnPolicy:
    """The run's algorithm when algo.groups is set: the contract of an on-policy algorithm (contracts.py), each call
    passed to the groups' own algorithms on their rows (the module docstring)."""

    def __init__(self, algos: Mapping[str, Any], layout: AgentGroups, gamma: float) -> None:
        self.algos = dict(algos)
        self.layout = layout
        self.networks = GroupNetworks({name: algo.networks for name, algo in self.algos.items()})
        firsts = list(self.algos.values())
        self.steps_per_collect = firsts[0].steps_per_collect
        self.gamma = gamma
        # schedules: a setting every group has is set in all of them (algo.schedules.ent_coef); <group>.<setting> in
        # one (the groups' own default schedules, e.g. a group's lr_schedule=linear)
        common = set(firsts[0].schedulable).intersection(*(a.schedulable for a in firsts[1:]))
        self.schedulable = tuple(sorted(common)) + tuple(
            f"{name}.{key}" for name, algo in self.algos.items() for key in algo.schedulable)
        self.default_schedules: dict[str, Schedule] = {
            f"{name}.{key}": schedule for name, algo in self.algos.items()
            for key, schedule in algo.default_schedules.items()}
        self._parts: list[RolloutStorage] | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        """A schedulable setting goes to the groups: <group>.<setting> to that group, a setting every group has to
        all of them (gamma too, which the run also reads here)."""
        algos = self.__dict__.get("algos")
        if algos is not None and "." in name:
            group, _, key = name.partition(".")
            setattr(algos[group], key, value)
            return
        if algos is not None and name in self.__dict__.get("schedulable", ()):
            for algo in algos.values():
                setattr(algo, name, value)
            if name not in self.__dict__:
                return
        object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        """A schedulable setting: <group>.<setting> from that group, one every group has from the first (a Ray
        worker is sent both, the groups' own last, so each group keeps its own value)."""
        if name.startswith("_") or "algos" not in self.__dict__:
            raise AttributeError(name)
        group, _, key = name.rpartition(".")
        if group in self.algos:
            return getattr(self.algos[group], key)
        if not group and name in self.__dict__.get("schedulable", ()):
            return getattr(next(iter(self.algos.values())), name)
        raise AttributeError(name)

    # ----------------------------------------------------------------------------- acting

    def _rows_group(self, obs: torch.Tensor) -> torch.Tensor:
        agent = agent_index(obs, self.layout.id_start, self.layout.n_agents)
        return torch.as_tensor(self.layout.group_of, device=obs.device)[agent]

    def _picked(self, outs: Sequence[ActOutput], obs: torch.Tensor) -> ActOutput:
        return ActOutput(*pick([tuple(out[:3]) for out in outs], self._rows_group(obs)))

    @torch.inference_mode()
    def act(self, obs: torch.Tensor, deterministic: bool = False, state: RecurrentState | None = None) -> ActOutput:
        return self._picked([algo.act(obs, deterministic) for algo in self.algos.values()], obs)

    @torch.inference_mode()
    def act_masked(self, obs: torch.Tensor, action_mask: torch.Tensor, deterministic: bool = False) -> ActOutput:
        return self._picked([algo.act_masked(obs, action_mask, deterministic) for algo in self.algos.values()], obs)

    def env_actions(self, actions: torch.Tensor) -> torch.Tensor:
        return next(iter(self.algos.values())).env_actions(actions)  # type: ignore[no-any-return]

    # ----------------------------------------------------------------------------- learning

    def finish_rollout(self, buffer: RolloutStorage, last_obs: torch.Tensor, state: RecurrentState | None) -> None:
        """Each group's columns of the rollout as a rollout of its own, its returns by its own algorithm."""
        columns = self._rows_group(last_obs)
        self._parts = []
        for k, algo in enumerate(self.algos.values()):
            envs = (columns == k).nonzero().squeeze(-1)
            part = buffer.columns(envs)  # type: ignore[attr-defined]
            algo.finish_rollout(part, last_obs[envs], None)
            self._parts.append(part)

    def update(self, buffer: RolloutStorage, clock: RunClock) -> dict[str, torch.Tensor]:
        """Each group's update on its own rollout; the metrics as <group>/<metric>."""
        if self._parts is None:
            raise RuntimeError("update() before finish_rollout(): the groups' rollouts are made there")
        metrics: dict[str, torch.Tensor] = {}
        for (name, algo), part in zip(self.algos.items(), self._parts, strict=True):
            metrics |= {f"{name}/{key}": value for key, value in algo.update(part, clock).items()}
        self._parts = None
        return metrics

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [optimizer for algo in self.algos.values() for optimizer in algo.optimizers()]

    def sub_algorithms(self) -> list[Any]:
        """The groups' algorithms: compile=true compiles each one's steps (loss_step.enable_compile)."""
        return list(self.algos.values())

    def population_refusal(self) -> str | None:
        return "algo.groups"

    def state_dict(self) -> dict[str, Any]:
        """`networks` as every algorithm's (what rl-eval, export and actor.init_from read); the rest of each group's
        state (optimizer, KL coefficient, ...) under `groups`."""
        return {"networks": self.networks.state_dict(),
                "groups": {name: {k: v for k, v in algo.state_dict().items() if k != "networks"}
                           for name, algo in self.algos.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.networks.load_state_dict(state["networks"])
        for name, algo in self.algos.items():
            algo.load_state_dict({**state["groups"][name], "networks": algo.networks.state_dict()})


def network_changes(group: str, changes: Any) -> dict[str, Any]:
    """algo.groups.<group>.actor: what the group's network changes from the run's `actor` (its sizes, activation,
    ...; not which network it is)."""
    actor = changes.get("actor") if isinstance(changes, Mapping) else None
    if actor is None:
        return {}
    if not isinstance(actor, Mapping):
        raise ConfigError(f"algo.groups.{group}.actor={actor!r}: a mapping of the run's actor settings (e.g. "
                          f"algo.groups.{group}.actor.hidden_sizes=[128,128])")
    if "name" in actor:
        raise ConfigError(f"algo.groups.{group}.actor.name={actor['name']}: a group's network is the run's actor with "
                          "other settings (hidden_sizes, activation, ...); set actor= for every group")
    return dict(actor)


def build_grouped(groups: Any, algo_cfg: dict[str, Any], network_cfg: dict[str, Any], env_factory: Any,
                  obs_space: gym.spaces.Space[Any], act_space: gym.spaces.Space[Any], device: torch.device,
                  num_envs: int) -> GroupedOnPolicy:
    """algo.groups: each group's algorithm on its own network, for its share of the rows (`num_envs` rows, the
    same share of every env copy)."""
    layout = group_layout(obs_space)
    # (the run's algorithm is an on-policy one that shares its rollout: run/build.py said so before the env was made)
    algos = {}
    copies = num_envs // layout.n_agents
    own_networks = {group: network_changes(group, changes) for group, changes in groups.items()} \
        if isinstance(groups, Mapping) else {}
    plain = {group: {k: v for k, v in changes.items() if k != "actor"} if isinstance(changes, Mapping) else changes
             for group, changes in groups.items()} if isinstance(groups, Mapping) else groups
    for k, (group, settings) in enumerate(group_settings(algo_cfg, plain, layout).items()):
        spec: AlgoSpec = ALGOS.spec(str(settings["name"]))
        use_sde = bool(settings.get("use_sde", False))
        try:
            networks = ACTORS.build(
                {**network_cfg, **own_networks.get(group, {})}, observation_space=group_space(obs_space, layout, k),
                action_space=act_space,
                normalize_obs=env_factory.normalize_obs, clip_obs=env_factory.clip_obs, heads="actor_critic",
                **({"value_outputs": spec.value_outputs} if spec.value_outputs > 1 else {}),
                **({"use_sde": True} if use_sde else {})).to(device)
            algos[group] = ALGOS.build(settings, networks=networks,
                                       num_envs=copies * len(layout.agents_of(k)))
        except ConfigError as error:  # a value named as the group's key, its rollout as the group's rows
            said = re.sub(r"\balgo\.(\w+)(=|')", rf"algo.groups.{group}.\1\2", str(error))
            said = said.replace("n_steps * num_envs", "n_steps * the group's rows")
            raise ConfigError(f"algo.groups.{group} ({settings['name']}): {said}") from None
    return GroupedOnPolicy(algos, layout, float(algo_cfg.get("gamma", 0.99)))
