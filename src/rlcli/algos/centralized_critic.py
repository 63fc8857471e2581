"""MASAC and MADDPG: a cooperative team's agents act on their own observations through one shared policy, and a
centralized critic values the team's joint action in the global state (Lowe et al. 2017; BenchMARL's MASAC and
MADDPG), on env=pz's joint mode with continuous actions (env.joint=true, which conf/algo/masac.yaml and maddpg.yaml
set: envs/multiagent.py).

SAC's and DDPG's losses, loops, temperature and target updates as they are (algos/sac.py, algos/td3.py); only the
networks differ. The policy reads agent i's line of the joint observation (its own observation, its one-hot index)
and gives its action; the critic reads the global state and every agent's action, those of agents that have ended
(their `active` flag 0) zeroed, and values the team reward:

    Q(s, a_1 .. a_N) <- r_team + discount * (min_k Q'_k(s', a'_1 .. a'_N) - alpha * sum_i log pi(a'_i | o'_i))

(MASAC; MADDPG the same with one critic, the target policy's actions and no entropy term). The policy's step
climbs Q at every agent's action drawn afresh from the policy, as BenchMARL's do; MASAC's entropy is the team's,
the sum of the active agents' log-probabilities, with SAC's automatic target of minus the joint action's size.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, cast

import gymnasium as gym
import torch
from torch import nn

from rlcli.actors.offpolicy import Critics, DeterministicPolicy, NetworkRecipe, SquashedGaussianPolicy
from rlcli.algos.runner import Runner
from rlcli.algos.sac import SAC
from rlcli.algos.td3 import DDPG, explored
from rlcli.contracts import ActOutput, AlgoSpec, RecurrentState
from rlcli.envs.multiagent import JointActions, JointBox
from rlcli.registry import ALGOS, ConfigError, require

# Anything but joint continuous actions reaches the constructor, which says in one line what to use
CENTRALIZED = AlgoSpec(on_policy=False, action_spaces=("JointBox", "JointActions", "Box", "Discrete", "MultiDiscrete"),
                       networks=("mlp",), population="lockstep", compiles=True)


def joint_box(action_space: gym.spaces.Space[Any], name: str) -> JointBox:
    """The joint mode's continuous action space, or a one-line error saying how to get it."""
    if isinstance(action_space, JointActions):
        raise ConfigError(f"algo={name} takes continuous (Box) actions; this env's agents act with Discrete ones: use "
                          "an env with continuous actions (env=coop_reach; mpe2's with "
                          "env.kwargs.continuous_actions=true), or algo=vdn, qmix")
    if not isinstance(action_space, JointBox):
        raise ConfigError(f"algo={name} learns from a team's joint transitions with continuous actions, and this env "
                          f"gives {type(action_space).__name__} actions: use a PettingZoo env with continuous actions "
                          f"(env=pz, e.g. env=coop_reach) with env.joint=true, as conf/algo/{name}.yaml sets; "
                          "algo=vdn, qmix for discrete actions")
    return action_space


def active_flags(obs: torch.Tensor, layout: JointBox) -> torch.Tensor:
    """[..., agents]: 1 for an agent still acting, 0 for one that has ended while its team goes on."""
    return obs[..., layout.agent_size]


class TeamCritics(nn.Module):
    """N centralized critics Q(s, a_1 .. a_N) over the joint observation and action: [N, batch]."""

    def __init__(self, recipe: NetworkRecipe, layout: JointBox, n: int) -> None:
        super().__init__()
        require(layout.state_size > 0, "env.joint", True, "gives no global state for the centralized critic")
        self.layout = layout
        state_recipe = dataclasses.replace(recipe, obs_dim=layout.state_size)
        self.critics = Critics(state_recipe, layout.n_agents * layout.action_dim, n)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        state = obs[..., 0, self.layout.agent_size + 1:]  # every agent's line carries the same global state
        joint = (actions * active_flags(obs, self.layout).unsqueeze(-1)).flatten(-2)
        qs: torch.Tensor = self.critics(state, joint)
        return qs


class TeamGaussianPolicy(nn.Module):
    """The group's shared squashed-Gaussian policy on each agent's line: actions [..., agents, action] and the
    team's log-probability [...], the sum over its active agents."""

    def __init__(self, recipe: NetworkRecipe, layout: JointBox) -> None:
        super().__init__()
        self.layout = layout
        self.agent = SquashedGaussianPolicy(dataclasses.replace(recipe, obs_dim=layout.agent_size), layout.action_dim)

    def forward(self, obs: torch.Tensor, deterministic: bool = False,
                noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        actions, log_probs = self.agent(obs[..., :self.layout.agent_size], deterministic, noise)
        return actions, (log_probs * active_flags(obs, self.layout)).sum(-1)

    def gradient_step_draws(self, rows: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (rows, self.layout.n_agents, self.layout.action_dim)
        return torch.randn(shape, device=device), torch.randn(shape, device=device)


class TeamDeterministicPolicy(nn.Module):
    """The group's shared deterministic policy on each agent's line: actions [..., agents, action]."""

    def __init__(self, recipe: NetworkRecipe, layout: JointBox) -> None:
        super().__init__()
        self.layout = layout
        self.agent = DeterministicPolicy(dataclasses.replace(recipe, obs_dim=layout.agent_size), layout.action_dim)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        actions: torch.Tensor = self.agent(obs[..., :self.layout.agent_size])
        return actions


class TeamSACNetworks(nn.Module):
    def __init__(self, recipe: NetworkRecipe, layout: JointBox, num_critics: int, log_alpha: float) -> None:
        super().__init__()
        self.normalizer = recipe.normalizer
        self.policy = TeamGaussianPolicy(recipe, layout)
        self.critics = TeamCritics(recipe, layout, num_critics)
        self.critics_target = copy.deepcopy(self.critics).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(float(log_alpha)))


class TeamDDPGNetworks(nn.Module):
    def __init__(self, recipe: NetworkRecipe, layout: JointBox, num_critics: int) -> None:
        super().__init__()
        self.normalizer = recipe.normalizer
        self.policy = TeamDeterministicPolicy(recipe, layout)
        self.critics = TeamCritics(recipe, layout, num_critics)
        self.policy_target = copy.deepcopy(self.policy).requires_grad_(False)
        self.critics_target = copy.deepcopy(self.critics).requires_grad_(False)


def check_joint_recipe(recipe: NetworkRecipe, name: str) -> None:
    require(not recipe.normalizer.enabled, "env.normalize_obs", True,
            f"is not built for algo={name} (it would rescale the agents' active flags): use false")


@ALGOS.register("masac", spec=CENTRALIZED)
class MASAC(SAC):
    """SAC with the team's shared policy and a centralized critic (module docstring)."""

    def __init__(self, recipe: NetworkRecipe, action_space: gym.spaces.Space[Any], num_envs: int,
                 **sac_settings: Any) -> None:
        self.layout = joint_box(action_space, "masac")
        check_joint_recipe(recipe, "masac")
        require(not sac_settings.get("use_sde", False), "algo.use_sde", True, "is not built for algo=masac: use false")
        super().__init__(recipe, action_space, num_envs, **sac_settings)

    def make_networks(self, recipe: Any, num_critics: int, log_alpha: float, use_sde: bool) -> nn.Module:
        return TeamSACNetworks(recipe, self.layout, num_critics, log_alpha)

    def random_actions(self, n: int) -> torch.Tensor:
        return super().random_actions(n).view(n, self.layout.n_agents, self.layout.action_dim)

    def entropy_log_probs(self, run: Runner, log_probs: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """The log-probs the temperature's step (and the logged entropy) read count each inactive agent as meeting
        its share of the target entropy, so that the temperature tunes each active agent's entropy toward
        target_entropy / agents (minus its action's size, by default) however many are left. The target is each
        member's own in a population (run.read: [members], over its rows)."""
        inactive = (1.0 - active_flags(obs, self.layout)).sum(-1)
        target = run.read(self.temperature.target)
        if isinstance(target, torch.Tensor):
            target = target.unsqueeze(-1)
        return log_probs - target * inactive / self.layout.n_agents


@ALGOS.register("maddpg", spec=CENTRALIZED)
class MADDPG(DDPG):
    """DDPG with the team's shared policy and a centralized critic (module docstring)."""

    def __init__(self, recipe: NetworkRecipe, action_space: gym.spaces.Space[Any], num_envs: int,
                 **ddpg_settings: Any) -> None:
        self.layout = joint_box(action_space, "maddpg")
        check_joint_recipe(recipe, "maddpg")
        super().__init__(recipe, action_space, num_envs, **ddpg_settings)

    def make_networks(self, recipe: Any, num_critics: int) -> nn.Module:
        return TeamDDPGNetworks(recipe, self.layout, num_critics)

    def random_actions(self, n: int) -> torch.Tensor:
        return super().random_actions(n).view(n, self.layout.n_agents, self.layout.action_dim)

    @torch.inference_mode()
    def act(self, obs: torch.Tensor, deterministic: bool = False, state: RecurrentState | None = None) -> ActOutput:
        """The team's actions, with each agent's exploration noise unless deterministic."""
        actions: torch.Tensor = cast(Any, self.networks).policy(obs)
        if not deterministic:
            actions = explored(actions, self.noise.sample(actions.shape, self.noise_scale).view(actions.shape))
        zeros = torch.zeros(actions.shape[0], device=actions.device)
        return ActOutput(actions, zeros, zeros)

    def actor_loss(self, obs: torch.Tensor) -> torch.Tensor:
        """Minus the first centralized critic's Q at every agent's action from the shared policy."""
        net: Any = self.networks
        loss: torch.Tensor = -net.critics(obs, net.policy(obs))[0].mean()
        return loss

    def critic_loss(self, batch: Any, noise: torch.Tensor | None = None,
                    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """DDPG's critic loss; target policy smoothing's draws (algo.target_policy_noise > 0) per agent."""
        if noise is not None:
            noise = noise.view(noise.shape[0], self.layout.n_agents, self.layout.action_dim)
        return super().critic_loss(batch, noise)
