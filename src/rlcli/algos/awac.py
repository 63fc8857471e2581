"""Advantage-Weighted Actor-Critic (Nair et al. 2020): twin critics learn Q of the current policy from the dataset
(r + gamma min Q_target(s', a' ~ pi)), and the actor is advantage-weighted regression on the dataset's actions with
A = Q(s, a) - Q(s, a ~ pi(s)), weights exp(A / lambda). Built for offline pre-training followed by online
fine-tuning; hyperparameters are CORL's (algorithms/offline/awac.py).
"""

from __future__ import annotations

import copy

import gymnasium as gym
import torch
from torch import nn

from rlcli.actors.offpolicy import Critics, NetworkRecipe
from rlcli.algos.awr import AdvantageWeightedActorCritic, GaussianActor, advantage_weights, awr_policy_loss
from rlcli.algos.base import adam
from rlcli.algos.offpolicy import StepOutput, critics_td_loss
from rlcli.algos.runner import Runner, batch_rows
from rlcli.batches import ReplayBatch
from rlcli.contracts import AlgoSpec
from rlcli.registry import ALGOS, require


class AWACNetworks(nn.Module):
    def __init__(self, torso: NetworkRecipe, action_dim: int):
        super().__init__()
        self.normalizer = torso.normalizer
        self.policy = GaussianActor(torso, action_dim, tanh_mean=False)  # CORL's: a plain mean, samples clamped
        self.critics = Critics(torso, action_dim, 2)
        self.critics_target = copy.deepcopy(self.critics).requires_grad_(False)


def awac_advantages(q_data: torch.Tensor, q_policy: torch.Tensor) -> torch.Tensor:
    """A = min over critics of Q(s, a) - min over critics of Q(s, a ~ pi(s)); [N, B] each -> [B]."""
    return q_data.min(0).values - q_policy.min(0).values


@ALGOS.register("awac", spec=AlgoSpec(on_policy=False, action_spaces=("Box",), networks=("mlp",), compiles=True,
                                      offline=True, population="lockstep"))
class AWAC(AdvantageWeightedActorCritic):
    """Advantage-Weighted Actor-Critic (Nair et al. 2020, offline then online): twin critics of the current policy,
    the actor advantage-weighted regression on the dataset's actions with weights exp(A / lambda)."""

    networks: AWACNetworks

    def __init__(
        self,
        recipe: NetworkRecipe,
        action_space: gym.spaces.Space,
        num_envs: int,
        lr: float = 3e-4,  # actor and critics
        batch_size: int = 256,
        learning_starts: int = 0,  # offline: learn from the first step
        train_freq: int = 1,  # loop steps between update phases (offline: one gradient step per loop step)
        gradient_steps: int = 1,  # gradient steps per update phase
        gamma: float = 0.99,
        tau: float = 0.005,  # target critics' Polyak weight
        awac_lambda: float = 1.0,  # temperature of the advantage weights exp(A / lambda)
        exp_adv_max: float = 100.0,  # clip of exp(A / lambda)
        reward_scale: float = 1.0,  # rewards are multiplied by it in the targets
        max_grad_norm: float | None = None,  # global grad-norm clip of each step (null: none)
    ) -> None:
        self.setup(action_space, num_envs, lr, batch_size, learning_starts, train_freq, gradient_steps, gamma, tau,
                   reward_scale, max_grad_norm)
        require(awac_lambda > 0, "algo.awac_lambda", awac_lambda, "must be > 0 (the advantage's temperature)")
        require(exp_adv_max > 0, "algo.exp_adv_max", exp_adv_max, "must be > 0")
        self.awac_lambda, self.exp_adv_max = awac_lambda, exp_adv_max
        self.networks = AWACNetworks(recipe, self.action_dim)
        self.policy_optimizer = adam(self.networks.policy.parameters(), lr=lr)
        self.critic_optimizer = adam(self.networks.critics.parameters(), lr=lr)
        self.schedulable += ("awac_lambda",)
        self.build_steps(self.critic_loss, self.policy_loss)  # the critics' step, then the actor's (CORL's order)

    def _gradient_step(self, batch: ReplayBatch, run: Runner) -> StepOutput:
        shape, device = (batch_rows(batch), self.action_dim), batch.rewards.device
        # the policy's draws, next actions' then the actions' the advantage baseline takes, from the run's stream
        next_noise, noise = run.draw(lambda: (torch.randn(shape, device=device), torch.randn(shape, device=device)))
        critic_loss, errors = run(self.critic_train_step, batch, next_noise)
        policy_loss, (advantages, weights) = run(self.policy_train_step, batch, noise)
        run.polyak(self.networks.critics_target, self.networks.critics)
        self.gradient_updates += 1
        return errors, {"value_loss": critic_loss.detach(), "policy_loss": policy_loss.detach(),
                        "advantage": run.mean(advantages), "awr_weight": run.mean(weights)}

    def critic_loss(self, batch: ReplayBatch, next_noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Both critics toward r + discount min Q_target(s', a' ~ pi(s')) (CORL's sum of the two MSEs)."""
        net = self.networks
        with torch.no_grad():
            next_actions, _ = net.policy(batch.next_obs, noise=next_noise)
            next_q = net.critics_target(batch.next_obs, next_actions).min(0).values
            target = self.reward_scale * batch.rewards + batch.discounts * next_q
        return critics_td_loss(net.critics(batch.obs, batch.actions), target, batch.weights, scale=1.0)

    def policy_loss(self, batch: ReplayBatch,
                    noise: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Advantage-weighted regression with A = Q(s, a) - Q(s, a ~ pi(s)) from the critics just stepped."""
        net = self.networks
        with torch.no_grad():
            pi_actions, _ = net.policy(batch.obs, noise=noise)
            advantages = awac_advantages(net.critics(batch.obs, batch.actions), net.critics(batch.obs, pi_actions))
            weights = advantage_weights(advantages, 1.0 / self.awac_lambda, self.exp_adv_max)
        return awr_policy_loss(net.policy, batch.obs, batch.actions, weights), (advantages, weights)
