"""Implicit Q-Learning (Kostrikov et al. 2021): offline RL that never evaluates the critics at an action the
dataset lacks. V(s) fits an upper expectile of the target twin Q over the dataset's actions (so it approaches the
best in-sample action's value), Q regresses toward r + gamma V(s'), and the actor is advantage-weighted regression
on exp(beta (Q - V)). Hyperparameters are CORL's (algorithms/offline/iql.py), including the actor's learning rate
annealed along a cosine to zero over the run.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Literal

import gymnasium as gym
import torch
from torch import nn

from rlcli.actors.offpolicy import Critics, DeterministicPolicy, NetworkRecipe
from rlcli.algos.awr import AdvantageWeightedActorCritic, GaussianActor, advantage_weights, awr_policy_loss
from rlcli.algos.base import adam
from rlcli.algos.loss_step import LossStep
from rlcli.algos.offpolicy import StepOutput, critics_td_loss
from rlcli.algos.runner import Runner
from rlcli.batches import ReplayBatch
from rlcli.contracts import AlgoSpec
from rlcli.registry import ALGOS, require
from rlcli.schedules import Schedule


def expectile_loss(diff: torch.Tensor, expectile: float) -> torch.Tensor:
    """mean(|tau - 1(u < 0)| u^2), u = Q - V: tau > 0.5 weighs V's underestimates more, toward an upper expectile."""
    return (torch.abs(expectile - (diff < 0).float()) * diff.square()).mean()


@dataclass(frozen=True)
class CosineSchedule(Schedule):
    """start -> end along half a cosine over the run: torch's CosineAnnealingLR(T_max = the run), as a factor."""

    def __call__(self, progress: float) -> float:
        p = min(max(progress, 0.0), 1.0)
        return self.end + (self.start - self.end) * 0.5 * (1.0 + math.cos(math.pi * p))


class IQLNetworks(nn.Module):
    def __init__(self, torso: NetworkRecipe, action_dim: int, deterministic_actor: bool):
        super().__init__()
        self.normalizer = torso.normalizer
        self.policy: GaussianActor | DeterministicPolicy = (
            DeterministicPolicy(torso, action_dim) if deterministic_actor else GaussianActor(torso, action_dim, True))
        self.critics = Critics(torso, action_dim, 2)
        self.critics_target = copy.deepcopy(self.critics).requires_grad_(False)
        self.value = torso.make(1)


@ALGOS.register("iql", spec=AlgoSpec(on_policy=False, action_spaces=("Box",), networks=("mlp",), compiles=True,
                                     offline=True, population="lockstep"))
class IQL(AdvantageWeightedActorCritic):
    """Implicit Q-Learning (Kostrikov et al. 2021, offline): V an upper expectile of Q over the dataset's actions, Q
    toward r + gamma V(s'), the actor advantage-weighted regression on the dataset's actions."""

    networks: IQLNetworks

    def __init__(
        self,
        recipe: NetworkRecipe,
        action_space: gym.spaces.Space,
        num_envs: int,
        lr: float = 3e-4,  # actor, critics and V (CORL's actor_lr = qf_lr = vf_lr)
        batch_size: int = 256,
        learning_starts: int = 0,  # offline: learn from the first step
        train_freq: int = 1,  # loop steps between update phases (offline: one gradient step per loop step)
        gradient_steps: int = 1,  # gradient steps per update phase
        gamma: float = 0.99,
        tau: float = 0.005,  # target critics' Polyak weight
        expectile: float = 0.7,  # V's expectile of Q (CORL's iql_tau; 0.9 for AntMaze)
        beta: float = 3.0,  # inverse temperature of the advantage weights exp(beta A) (10 for AntMaze)
        exp_adv_max: float = 100.0,  # clip of exp(beta A)
        deterministic_actor: bool = False,  # true: a tanh policy regressed with weighted squared error (CORL's
                                            # iql_deterministic)
        actor_lr_schedule: Literal["cosine", "constant"] = "cosine",  # cosine (CORL's CosineAnnealingLR to 0 over the
                                                                      # run) or constant
        reward_scale: float = 1.0,  # rewards are multiplied by it in the targets
        max_grad_norm: float | None = None,  # global grad-norm clip of each step (null: none)
    ) -> None:
        self.setup(action_space, num_envs, lr, batch_size, learning_starts, train_freq, gradient_steps, gamma, tau,
                   reward_scale, max_grad_norm)
        require(0 < expectile < 1, "algo.expectile", expectile, "must be in (0, 1) (0.5: the mean; CORL: 0.7)")
        require(beta >= 0, "algo.beta", beta, "must be >= 0 (0: plain behaviour cloning)")
        require(exp_adv_max > 0, "algo.exp_adv_max", exp_adv_max, "must be > 0")
        require(actor_lr_schedule in ("cosine", "constant"), "algo.actor_lr_schedule", actor_lr_schedule,
                "choose from: cosine, constant")
        self.expectile, self.beta, self.exp_adv_max = expectile, beta, exp_adv_max
        self.networks = IQLNetworks(recipe, self.action_dim, deterministic_actor)
        net = self.networks
        self.policy_optimizer = adam(net.policy.parameters(), lr=lr)
        self.critic_optimizer = adam(net.critics.parameters(), lr=lr)
        self.value_optimizer = adam(net.value.parameters(), lr=lr)
        self._actor_lr_scale = 1.0
        if actor_lr_schedule == "cosine":
            self.default_schedules["actor_lr_scale"] = CosineSchedule("cosine", 1.0, 0.0)
        self.schedulable += ("actor_lr_scale", "expectile", "beta")
        # V's step, then Q's (toward V(s') as it was before V's step), then the actor's (CORL's order)
        self.value_train_step = LossStep(net, self.value_optimizer, self.value_loss, self)
        self.build_steps(self.critic_loss, self.policy_loss)

    @property
    def actor_lr_scale(self) -> float:
        """The factor on the actor's learning rate (CORL's cosine annealing: 1 -> 0 over the run)."""
        return self._actor_lr_scale

    @actor_lr_scale.setter
    def actor_lr_scale(self, value: float) -> None:
        self._actor_lr_scale = float(value)
        for group in self.policy_optimizer.param_groups:
            group.setdefault("base_lr", group["lr"])  # kept in the optimizer's state: resume sees it
            group["lr"] = group["base_lr"] * self._actor_lr_scale

    def named_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {**super().named_optimizers(), "value_optimizer": self.value_optimizer}

    def _gradient_step(self, batch: ReplayBatch, run: Runner) -> StepOutput:
        value_loss, (advantages, next_v) = run(self.value_train_step, batch)
        critic_loss, errors = run(self.critic_train_step, batch, next_v)
        run.polyak(self.networks.critics_target, self.networks.critics)
        policy_loss, weights = run(self.policy_train_step, batch, advantages)
        self.gradient_updates += 1
        return errors, {"value_loss": value_loss.detach(), "q_loss": critic_loss.detach(),
                        "policy_loss": policy_loss.detach(), "advantage": run.mean(advantages),
                        "awr_weight": run.mean(weights)}

    def value_loss(self, batch: ReplayBatch) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """V's expectile loss toward min of the target twin Q at the dataset's actions; with the advantages
        Q - V (the actor's) and V(s') (the critics' target), both before V's step."""
        net = self.networks
        with torch.no_grad():
            target_q = net.critics_target(batch.obs, batch.actions).min(0).values
            next_v = net.value(batch.next_obs).squeeze(-1)
        diff = target_q - net.value(batch.obs).squeeze(-1)
        return expectile_loss(diff, self.expectile), (diff.detach(), next_v)

    def critic_loss(self, batch: ReplayBatch, next_v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Both critics toward r + discount V(s') (CORL's mean of the two MSEs: SAC's 0.5 x their sum)."""
        target = self.reward_scale * batch.rewards + batch.discounts * next_v
        return critics_td_loss(self.networks.critics(batch.obs, batch.actions), target, batch.weights, scale=0.5)

    def policy_loss(self, batch: ReplayBatch, advantages: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Advantage-weighted regression on the dataset's actions; with the weights (for the logs)."""
        weights = advantage_weights(advantages, self.beta, self.exp_adv_max)
        return awr_policy_loss(self.networks.policy, batch.obs, batch.actions, weights), weights
