"""Value decomposition for a cooperative team with discrete actions: VDN (Sunehag et al. 2018) and QMIX (Rashid et
al. 2018), on env=pz's joint mode (env.joint=true, which conf/algo/vdn.yaml and qmix.yaml set: envs/multiagent.py).

One Q-network is shared by the group's agents (each reads its own observation and one-hot index); the team's value of
a joint action is Q_tot = sum_i Q_i(o_i, a_i) (VDN) or a monotonic mix of them conditioned on the global state (QMIX,
actors/mixers.py). DQN's loop, exploration, losses and target network as they are (algos/dqn.py), on joint transitions:

    target = r_team + discount * Q_tot'(max_a Q'_i(o'_i, a) for each agent i; s')

with the target network's agents and mixer (double Q: the online agents pick the next actions). An agent that has
terminated while its team goes on (its `active` flag 0) counts for nothing on either side, and acts no more.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Literal

import gymnasium as gym
import torch
from torch import nn

from rlcli.actors.mixers import QMixer, rescalable
from rlcli.actors.normalizer import RunningNorm
from rlcli.actors.offpolicy import NetworkRecipe, QNetwork
from rlcli.algos.base import adam
from rlcli.algos.dqn import DQN, q_regression_loss
from rlcli.algos.loss_step import LossStep
from rlcli.algos.offpolicy import TrainFreqUnit
from rlcli.contracts import AlgoSpec
from rlcli.envs.multiagent import JointActions
from rlcli.registry import ALGOS, ConfigError, require

# Anything but joint actions reaches the constructor, which says in one line what to use (env.joint=true)
JOINT = AlgoSpec(on_policy=False, action_spaces=("JointActions", "JointBox", "Discrete", "MultiDiscrete", "Box"),
                 networks=("mlp",), population="lockstep", compiles=True)


class TeamQ(nn.Module):
    """The group's shared agent network and the mixer (none: VDN's sum) over the joint observation's layout."""

    def __init__(self, agent: nn.Module, layout: JointActions, mixer: nn.Module | None) -> None:
        super().__init__()
        self.agent, self.mixer, self.agent_size = agent, mixer, layout.agent_size

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Each agent's Q-values [..., agents, actions] from the joint observation [..., agents, inputs]."""
        out: torch.Tensor = self.agent(obs[..., :self.agent_size])
        return out

    def total(self, qs: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """Q_tot [...] of the agents' chosen Qs [..., agents]: inactive agents' zeroed, then summed (VDN) or mixed
        with the global state (QMIX)."""
        qs = qs * obs[..., self.agent_size]
        if self.mixer is None:
            return qs.sum(-1)
        mixed: torch.Tensor = self.mixer(qs, obs[..., 0, self.agent_size + 1:])
        return mixed


class TeamQNetworks(nn.Module):
    def __init__(self, normalizer: RunningNorm, q: TeamQ) -> None:
        super().__init__()
        self.normalizer, self.q = normalizer, q
        self.q_target = copy.deepcopy(q).requires_grad_(False)


def joint_layout(action_space: gym.spaces.Space[Any], name: str) -> JointActions:
    """The joint mode's discrete action space, or a one-line error saying how to get it."""
    if not isinstance(action_space, JointActions) and getattr(action_space, "n_agents", None) is not None:
        raise ConfigError(f"algo={name} takes one Discrete action per agent; this env's agents act with "
                          "continuous (Box) actions: use an env with Discrete actions (env=coop_match; mpe2's with "
                          "env.kwargs.continuous_actions=false), or algo=masac, maddpg")
    if not isinstance(action_space, JointActions):
        raise ConfigError(f"algo={name} learns from a team's joint transitions, and this env gives "
                          f"{type(action_space).__name__} actions (one row per agent, or one agent): use "
                          "env.joint=true with a PettingZoo env (env=pz, coop_match, simple_spread_v3), as "
                          f"conf/algo/{name}.yaml sets")
    return action_space


@ALGOS.register("vdn", spec=JOINT)
class VDN(DQN):
    """VDN: DQN on joint transitions, Q_tot the sum of the agents' Qs (module docstring)."""

    name = "vdn"
    networks: TeamQNetworks  # type: ignore[assignment]

    def __init__(
        self,
        recipe: NetworkRecipe,
        action_space: gym.spaces.Space[Any],
        num_envs: int,
        lr: float = 5e-4,
        batch_size: int = 32,
        learning_starts: int = 1000,  # env steps (of a copy's whole team) of random actions before the first update
        train_freq: int = 1,  # env steps per copy between update phases
        train_freq_unit: TrainFreqUnit = "step",  # step | episode
        gradient_steps: int = 1,
        gamma: float = 0.99,
        tau: float = 1.0,  # target update weight: 1 = hard copy, <1 = Polyak averaging
        target_update_interval: int = 1000,  # steps between target updates, of the unit target_update_unit names
        target_update_unit: Literal["env_step", "gradient_step"] = "env_step",  # env_step | gradient_step (algo=dqn's)
        exploration_fraction: float = 0.1,  # fraction of train.total_steps over which each agent's epsilon decays
        exploration_initial_eps: float = 1.0,
        exploration_final_eps: float = 0.05,
        loss: Literal["huber", "mse"] = "mse",  # mse (PyMARL's) | huber
        double: bool = True,  # the online agents pick the next actions, the target network values them
        dueling: bool = False,
        max_grad_norm: float | None = 10.0,
        reward_scale: float = 1.0,
    ) -> None:
        layout = joint_layout(action_space, self.name)
        require(not recipe.normalizer.enabled, "env.normalize_obs", True,
                f"is not built for algo={self.name} (it would rescale the agents' active flags): use false")
        agent_recipe = dataclasses.replace(recipe, obs_dim=layout.agent_size)
        super().__init__(agent_recipe, gym.spaces.Discrete(layout.n_actions), num_envs, lr=lr, batch_size=batch_size,
                         learning_starts=learning_starts, train_freq=train_freq, train_freq_unit=train_freq_unit,
                         gradient_steps=gradient_steps, gamma=gamma, tau=tau,
                         target_update_interval=target_update_interval, target_update_unit=target_update_unit,
                         exploration_fraction=exploration_fraction,
                         exploration_initial_eps=exploration_initial_eps, exploration_final_eps=exploration_final_eps,
                         loss=loss, double=double, dueling=dueling, max_grad_norm=max_grad_norm,
                         reward_scale=reward_scale)
        self.n_agents = layout.n_agents
        self.networks = TeamQNetworks(recipe.normalizer, TeamQ(QNetwork(agent_recipe, self.n_actions, dueling),
                                                                layout, self.mixer(layout)))
        self.optimizer = adam(self.networks.q.parameters(), lr=lr)
        self.train_step = LossStep(self.networks, self.optimizer, self.transition_loss, clip_of=self)

    def mixer(self, layout: JointActions) -> nn.Module | None:
        """VDN sums the agents' Qs: no mixer."""
        return None

    def random_actions(self, n: int) -> torch.Tensor:
        return torch.randint(0, self.n_actions, (n, self.n_agents))

    def transition_loss(self, batch: Any) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The team's (double) Q-learning loss on joint transitions, with each one's TD error (PER priorities) and the
        mean Q_tot of the joint actions taken."""
        q, q_target = self.networks.q, self.networks.q_target
        with torch.no_grad():
            next_qs = q_target(batch.next_obs)  # [B, agents, actions]
            greedy = (q(batch.next_obs) if self.double else next_qs).argmax(-1, keepdim=True)
            next_total = q_target.total(next_qs.gather(-1, greedy).squeeze(-1), batch.next_obs)
            target = self.reward_scale * batch.rewards + batch.discounts * next_total
        taken = q(batch.obs).gather(-1, batch.actions.long().unsqueeze(-1)).squeeze(-1)  # [B, agents]
        total = q.total(taken, batch.obs)
        per_sample = q_regression_loss(total, target, self.loss)
        return (batch.weights * per_sample).mean(), ((total - target).detach(), total.detach().mean())


@ALGOS.register("qmix", spec=JOINT)
class QMIX(VDN):
    """QMIX: VDN's sum replaced by a monotonic mixing network on the global state (actors/mixers.py)."""

    name = "qmix"

    def __init__(
        self,
        recipe: NetworkRecipe,
        action_space: gym.spaces.Space[Any],
        num_envs: int,
        mixer_embed_dim: int = 32,  # the mixing network's hidden width (PyMARL's and BenchMARL's)
        hypernet_hidden: int = 64,  # the hypernetworks' hidden layer (hypernet_layers=2)
        hypernet_layers: int = 2,  # the mixing weights' hypernetworks: 2 (a hidden layer, PyMARL's) | 1 (one linear
                                   # layer, torchrl's QMixer, which BenchMARL's QMIX uses)
        scale_state: bool = False,  # the mixer reads the global state rescaled to [-1, 1] by the env's bounds
        **vdn_settings: Any,
    ) -> None:
        require(mixer_embed_dim > 0, "algo.mixer_embed_dim", mixer_embed_dim, "must be > 0")
        require(hypernet_hidden > 0, "algo.hypernet_hidden", hypernet_hidden, "must be > 0")
        require(hypernet_layers in (1, 2), "algo.hypernet_layers", hypernet_layers, "choose from: 1, 2")
        self.mixer_embed_dim, self.hypernet_hidden, self.hypernet_layers = mixer_embed_dim, hypernet_hidden, \
            hypernet_layers
        self.scale_state = scale_state
        super().__init__(recipe, action_space, num_envs, **vdn_settings)

    def mixer(self, layout: JointActions) -> nn.Module | None:
        require(layout.state_size > 0, "env.joint", True, "gives no global state for QMIX's mixer")
        bounds = (layout.state_low, layout.state_high) if self.scale_state else None
        require(bounds is None or bool(rescalable(*bounds).any()), "algo.scale_state", True,
                "has nothing to rescale: this env names no finite bounds for its global state (use false)")
        return QMixer(layout.n_agents, layout.state_size, self.mixer_embed_dim, self.hypernet_hidden,
                      self.hypernet_layers, bounds)
