"""ReBRAC (Tarasov et al. 2023): TD3+BC revisited, with the behaviour penalty in both losses and LayerNorm critics.

Policy: (actor_bc_coef * ||pi(s) - a||^2 - lambda * min_i Q_i(s, pi(s))).mean(), lambda = 1 / mean|min Q| (detached)
when normalize_q, else 1. Critics: TD3's target at the smoothed target action a' minus
critic_bc_coef * ||a' - a_next||^2, a_next being the action the dataset took at s' (the paper's eq. and CORL's
rebrac.py). Replay batches carry no next action, so each batch's are read from the storage: the action stored in the
slot after a transition's, where that slot's observation is the transition's next observation (a dataset fills replay
in episode order). Where none follows (an episode's last step) there is no penalty; a terminal step has no bootstrap
anyway. Online transitions of several envs interleave, so an offline-to-online run penalizes only the dataset's.
"""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from rlcli.actors.offpolicy import NetworkRecipe
from rlcli.algos.base import adam
from rlcli.algos.offpolicy import critics_td_loss
from rlcli.algos.td3_bc import OFFLINE_TD3, BehaviorRegularizedTD3
from rlcli.registry import ALGOS, ConfigError, require


@ALGOS.register("rebrac", spec=OFFLINE_TD3)
class ReBRAC(BehaviorRegularizedTD3):
    """ReBRAC (Tarasov et al. 2023, offline): TD3+BC with the behaviour penalty in both the policy's and the critics'
    losses, LayerNorm critics, deeper networks and large batches."""

    def __init__(
        self,
        recipe: NetworkRecipe,
        action_space: gym.spaces.Space,
        num_envs: int,
        actor_bc_coef: float = 1.0,  # weight of the squared distance from pi(s) to the data's action, in the policy's
                                     # loss
        critic_bc_coef: float = 1.0,  # weight of the squared distance from the target's next action to the data's, off
                                      # the next Q
        normalize_q: bool = True,  # divide the policy's Q term by its mean absolute value (detached)
        actor_layer_norm: bool = False,  # LayerNorm after each hidden activation of the policy
        critic_layer_norm: bool = True,  # ... and of the critics
        lr: float = 1e-3,  # Adam's step size, policy and critics
        batch_size: int = 1024,  # transitions per gradient step
        learning_starts: int = 0,  # an offline run learns from its first step
        **td3_settings: Any,
    ) -> None:
        require(actor_bc_coef >= 0, "algo.actor_bc_coef", actor_bc_coef, "must be >= 0")
        require(critic_bc_coef >= 0, "algo.critic_bc_coef", critic_bc_coef, "must be >= 0")
        self.actor_bc_coef, self.critic_bc_coef, self.normalize_q = actor_bc_coef, critic_bc_coef, normalize_q
        super().__init__(recipe, action_space, num_envs, lr=lr, batch_size=batch_size,
                         learning_starts=learning_starts, **td3_settings)
        net = self.networks  # LayerNorm adds parameters: the target copies and optimizers are made again with them
        if actor_layer_norm:
            with_layer_norm(net.policy)
            net.policy_target = copy.deepcopy(net.policy).requires_grad_(False)
            self.policy_optimizer = adam(net.policy.parameters(), lr=lr)
        if critic_layer_norm:
            with_layer_norm(net.critics)
            net.critics_target = copy.deepcopy(net.critics).requires_grad_(False)
            self.critic_optimizer = adam(net.critics.parameters(), lr=lr)
        self.schedulable = (*self.schedulable, "actor_bc_coef", "critic_bc_coef")
        self.build_steps(self.critic_loss, self.policy_loss)

    def critic_inputs(self, batch: Any, storage: Any) -> tuple[torch.Tensor, ...]:
        """The data's next action after each sampled transition, and where one follows (the critics' penalty)."""
        return stored_next_actions(storage, batch.indices)

    def critic_loss(self, batch: Any, noise: torch.Tensor | None = None, next_data_actions: torch.Tensor | None = None,
                    follows: torch.Tensor | None = None) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """TD3's critics' loss with the target's next value penalized by critic_bc_coef * ||a' - a_next||^2
        (`follows`: 1 where the data has a next action); with each transition's |TD error| and the mean Q."""
        net = self.networks
        with torch.no_grad():
            next_actions = net.policy_target(batch.next_obs)
            if self.target_policy_noise > 0:  # target policy smoothing, as TD3's
                drawn = torch.randn_like(next_actions) if noise is None else noise
                smoothing = (drawn * self.target_policy_noise).clamp(-self.target_noise_clip, self.target_noise_clip)
                next_actions = (next_actions + smoothing).clamp(-1.0, 1.0)
            next_q = net.critics_target(batch.next_obs, next_actions).min(0).values
            if next_data_actions is not None and follows is not None:
                next_q = next_q - self.critic_bc_coef * follows * (next_actions - next_data_actions).square().sum(-1)
            target = self.reward_scale * batch.rewards + batch.discounts * next_q
        qs = net.critics(batch.obs, batch.actions)
        loss, priorities = critics_td_loss(qs, target, batch.weights)
        return loss, (priorities, qs.detach().mean())

    def policy_loss(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(actor_bc_coef * ||pi(s) - a||^2 - lambda * min Q(s, pi(s))).mean(); and the mean squared distance."""
        net = self.networks
        pi = net.policy(obs)
        q = net.critics(obs, pi).min(0).values
        lmbda = 1.0 / q.abs().mean().detach() if self.normalize_q else 1.0
        penalty = (pi - actions).square().sum(-1)
        return (self.actor_bc_coef * penalty - lmbda * q).mean(), penalty.mean().detach()


def with_layer_norm(module: nn.Module) -> None:
    """Put a LayerNorm after every hidden activation of `module`'s MLPs (ReBRAC's critics, CORL's placement);
    the output layers stay as they are."""
    for child in list(module.modules()):
        if isinstance(child, nn.Sequential):
            activations = [j for j in range(1, len(child)) if isinstance(child[j - 1], nn.Linear)
                           and not isinstance(child[j], (nn.Linear, nn.Sequential, nn.LayerNorm))]
            for j in reversed(activations):  # a Linear's activation, then its normalization
                child.insert(j + 1, nn.LayerNorm(child[j - 1].out_features))


def stored_next_actions(buffer: Any, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For each sampled slot: the action stored in the slot after it, and 1.0 where that slot holds the transition
    that follows in the data (its observation is this one's next observation), else 0.0 (an episode's end, the
    ring's newest slot, or envs interleaved online). On the indices' device."""
    if not all(hasattr(buffer, name) for name in ("obs", "next_obs", "actions", "capacity")):
        raise ConfigError(f"algo=rebrac reads each transition's next action from transition replay (buffer=replay); "
                          f"{type(buffer).__name__} keeps no obs/next_obs/actions tensors")
    rows = indices.to(buffer.actions.device)
    after = (rows + 1) % buffer.capacity
    # (any shape of indices: a population's are [members, batch])
    follows = (buffer.obs[after] == buffer.next_obs[rows]).flatten(rows.dim()).all(-1) & (after < len(buffer))
    return buffer.actions[after].to(indices.device), follows.float().to(indices.device)
