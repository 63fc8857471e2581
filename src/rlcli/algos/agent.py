"""config + an env's spaces -> the algorithm with its networks: what a run, a Ray worker and rl-eval build alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

import rlcli.actors  # noqa: F401  (registers the network recipes)
import rlcli.algos  # noqa: F401  (registers the algorithms)
from rlcli.actors.offpolicy import NetworkRecipe
from rlcli.algos.addons import build_addons
from rlcli.contracts import AlgoSpec, NetworkSpec, RecurrentNetworks
from rlcli.envs import GymEnvFactory
from rlcli.registry import ACTORS, ALGOS, ConfigError


def section(cfg: DictConfig, key: str) -> dict[str, Any]:
    node = cfg.get(key)
    if node is None:
        raise ConfigError(f"the config has no '{key}' section")
    return OmegaConf.to_container(node, resolve=True)  # type: ignore[return-value]


def network_section(cfg: DictConfig) -> dict[str, Any]:
    """The actor config without `init_from`, which the build step handles for every network alike."""
    actor = section(cfg, "actor")
    actor.pop("init_from", None)
    return actor


def algo_section(cfg: DictConfig) -> dict[str, Any]:
    """The algo config without the keys applied to every algorithm alike (schedules, add-ons, groups)."""
    algo = section(cfg, "algo")
    algo.pop("schedules", None)
    algo.pop("policy_loss_addons", None)
    algo.pop("groups", None)  # each group's own settings (algos/grouped.py)
    return algo


@dataclass
class Agent:
    """An algorithm with its networks, built for an env's spaces (what training and rl-eval share)."""

    algo: Any
    spec: AlgoSpec
    network_spec: NetworkSpec
    addons: list[Any]
    carry_size: int  # > 0: the networks are recurrent
    obs_dtype: torch.dtype  # uint8 for pixels


def build_agent(cfg: DictConfig, env_factory: GymEnvFactory, obs_space: Any, act_space: Any, device: torch.device,
                num_envs: int, with_addons: bool = True) -> Agent:
    """Check the algorithm against the env's spaces, then build the networks and the algorithm on `device`."""
    algo_cfg = algo_section(cfg)
    spec: AlgoSpec = ALGOS.spec(algo_cfg["name"])
    network_spec: NetworkSpec = ACTORS.spec(cfg.actor.name)
    if type(act_space).__name__ not in spec.action_spaces:
        raise ConfigError(f"algo={algo_cfg['name']} cannot handle {type(act_space).__name__} actions of env "
                          f"{env_factory.spec.id}; it supports: {', '.join(spec.action_spaces)}")
    if spec.check_observations is not None:
        spec.check_observations(obs_space, env_factory.spec.id)
    groups = cfg.algo.get("groups")
    if groups:  # each group of agents its own on-policy algorithm (algos/grouped.py)
        if cfg.algo.get("policy_loss_addons"):
            raise ConfigError("algo.policy_loss_addons with algo.groups: the add-ons are not built per group yet; "
                              "drop one of them")
        if network_spec.recurrent:
            raise ConfigError(f"algo.groups takes feed-forward networks; actor={cfg.actor.name} is recurrent: use "
                              "actor=mlp")
        from rlcli.algos.grouped import build_grouped

        settings = OmegaConf.to_container(groups, resolve=True) if OmegaConf.is_config(groups) else groups
        grouped = build_grouped(settings, algo_cfg, network_section(cfg),
                                env_factory, obs_space, act_space, device, num_envs)
        check_contract(grouped, algo_cfg["name"], spec)
        return Agent(grouped, spec, network_spec, [], 0, torch.float32)
    actor_critic = spec.heads == "actor_critic"
    # gSDE is the algorithm's setting (algo.use_sde, as in SB3), but an actor-critic's head is the network's
    use_sde = actor_critic and bool(algo_cfg.get("use_sde", False))
    built = ACTORS.build(
        network_section(cfg), observation_space=obs_space, action_space=act_space,
        normalize_obs=env_factory.normalize_obs, clip_obs=env_factory.clip_obs, heads=spec.heads,
        **({"value_outputs": spec.value_outputs} if spec.value_outputs > 1 else {}),
        **({"use_sde": True} if use_sde else {}),
    )
    if actor_critic:
        built = built.to(device)
    addon_cfg = cfg.algo.get("policy_loss_addons") if with_addons else None
    addons = build_addons(built, OmegaConf.to_container(addon_cfg) if addon_cfg else None,  # type: ignore[arg-type]
                          supported=actor_critic and not network_spec.recurrent,
                          trusted_checkpoint=bool(cfg.get("trusted_checkpoint", False)))
    if actor_critic:  # the recipe builds the whole network; other algorithms build theirs from a recipe
        algo = ALGOS.build(algo_cfg, networks=built, num_envs=num_envs, **({"policy_addons": addons} if addons else {}))
    else:
        algo = ALGOS.build(algo_cfg, recipe=built, action_space=act_space, num_envs=num_envs)
        if isinstance(built, NetworkRecipe):  # env.share_params=false: the algorithm built per-agent networks
            built.check_per_agent(algo_cfg["name"])
        algo.networks.to(device)
    check_contract(algo, algo_cfg["name"], spec)
    carry_size = algo.networks.carry_size if isinstance(algo.networks, RecurrentNetworks) else 0
    obs_dtype = torch.uint8 if network_spec.image and obs_space.dtype == "uint8" else torch.float32
    return Agent(algo, spec, network_spec, addons, carry_size, obs_dtype)


# What the loop reads on every algorithm (contracts.Algorithm, and OffPolicyAlgorithm's additions).
CONTRACT = ("networks", "steps_per_collect", "gamma", "default_schedules", "schedulable", "optimizers", "act",
            "env_actions", "update", "state_dict", "load_state_dict")
OFF_POLICY_CONTRACT = ("batch_size", "learning_starts", "episodes_per_collect", "random_actions")


def check_contract(algo: Any, name: str, spec: AlgoSpec) -> None:
    """A plugin algorithm written against an older contract: one line naming what it lacks, before any run state
    exists, instead of an AttributeError deep in the loop (the built-in ones are checked by mypy)."""
    wanted = CONTRACT + (() if spec.on_policy else OFF_POLICY_CONTRACT) + (("finish_rollout",) if spec.on_policy
                                                                         else ())
    missing = [attribute for attribute in wanted if not hasattr(algo, attribute)]
    if missing:
        raise ConfigError(f"algo={name} ({type(algo).__module__}.{type(algo).__name__}) lacks {', '.join(missing)}, "
                          "which rlcli's algorithm contract asks for (rlcli/contracts.py, "
                          "docs/guide/adding-an-algorithm.md)")
