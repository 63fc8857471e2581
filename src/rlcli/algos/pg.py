"""Vanilla policy gradient (REINFORCE, Williams 1992), with an optional learned baseline.

Per rollout: discounted returns-to-go (GAE with lambda = 1), one gradient step on
-log pi(a|s) * (G - b(s)). With `baseline: false` the value head is not trained and
b = 0: the advantage is the plain return, bootstrapped with 0 where a rollout cuts an episode,
so give it rollouts longer than the episodes (n_steps x num_envs) or keep the baseline.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rlcli.actors.mlp import ActorCritic
from rlcli.algos.addons import PolicyAddon
from rlcli.algos.base import (
    Decay,
    adam,
    check_common,
    explained_variance,
    finish_with_gae,
    param_groups,
)
from rlcli.algos.loss_step import LossStep
from rlcli.algos.losses import policy_gradient_terms, squared_value_loss
from rlcli.algos.one_step import OneStepUpdate
from rlcli.batches import RolloutBatch
from rlcli.contracts import ON_POLICY_ACTIONS, ActOutput, AlgoSpec, RecurrentState, RolloutStorage
from rlcli.registry import ALGOS
from rlcli.schedules import to_zero


@ALGOS.register("pg", spec=AlgoSpec(on_policy=True, compiles=True, action_spaces=ON_POLICY_ACTIONS,
                                    population="on_policy"))
class PolicyGradient(OneStepUpdate):
    def __init__(
        self,
        networks: ActorCritic,
        num_envs: int,
        policy_addons: Sequence[PolicyAddon] = (),
        n_steps: int = 500,  # env steps per env per rollout: longer than most episodes (returns are Monte Carlo)
        lr: float = 1e-2,
        lr_pi: float | None = None,
        lr_v: float | None = None,
        lr_schedule: Decay = "constant",
        gamma: float = 0.99,
        baseline: bool = True,  # learned value baseline b(s); false = plain REINFORCE (b = 0)
        normalize_advantage: bool = True,
        ent_coef: float = 0.0,
        vf_coef: float = 0.5,
        max_grad_norm: float | None = None,
    ) -> None:
        check_common(n_steps, lr, lr_pi, lr_v, gamma, 1.0, ent_coef, vf_coef, max_grad_norm)
        self.networks = networks
        self.policy_addons = list(policy_addons)  # extra policy-loss terms (rlcli/algos/addons.py)
        self.n_steps, self.gamma, self.gae_lambda = n_steps, gamma, 1.0
        self.steps_per_collect = n_steps
        self.baseline, self.normalize_advantage = baseline, normalize_advantage
        self.lr_scale = 1.0  # lr_schedule=linear: a factor from 1 to 0, set by the trainer's schedules
        linear = to_zero(lr_schedule)
        self.default_schedules = {"lr_scale": linear} if linear else {}
        self.ent_coef, self.vf_coef, self.max_grad_norm = ent_coef, vf_coef, max_grad_norm
        self.schedulable: tuple[str, ...] = ("lr_scale", "ent_coef", "vf_coef", "gamma", "max_grad_norm")
        self.optimizer = adam(param_groups(networks, lr, lr_pi, lr_v))
        self.train_step = LossStep(networks, self.optimizer, self.minibatch_loss, clip_of=self)

    @torch.inference_mode()
    def act(self, obs: torch.Tensor, deterministic: bool = False, state: RecurrentState | None = None) -> ActOutput:
        out = self.networks.act(obs, deterministic, state)
        if self.baseline:
            return out
        return out._replace(values=torch.zeros_like(out.values))  # b(s) = 0: plain returns

    def value(self, obs: torch.Tensor, state: RecurrentState | None = None) -> torch.Tensor:
        """The baseline that cut-off rollouts are bootstrapped with: 0 without a baseline."""
        values = self.networks.value(obs, state)
        return values if self.baseline else torch.zeros_like(values)

    def finish_rollout(self, buffer: RolloutStorage, last_obs: torch.Tensor, state: RecurrentState | None) -> None:
        finish_with_gae(self.value, buffer, last_obs, state, self.gamma, self.gae_lambda)

    def minibatch_loss(self, batch: RolloutBatch, ent_coef: float | torch.Tensor, vf_coef: float | torch.Tensor,
                       addon_coefs: Sequence[Any] | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The advantages are G - b(s) (b = 0 without a baseline, and then no value loss)."""
        policy_loss, entropy_mean, values, addon_logs = policy_gradient_terms(
            self.networks, batch, self.policy_addons, self.normalize_advantage, addon_coefs)
        loss = policy_loss - ent_coef * entropy_mean
        stats = {"policy_loss": policy_loss.detach(), "entropy": entropy_mean.detach()}
        if self.baseline:
            value_loss = squared_value_loss(values, batch.returns, batch.mask)
            loss = loss + vf_coef * value_loss
            stats["value_loss"] = value_loss.detach()
        return loss, {**stats, "loss": loss.detach(), **addon_logs}

    def update_metrics(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        metrics = {"explained_variance": explained_variance(batch.values, batch.returns, batch.mask)} \
            if self.baseline else {}
        return {**metrics, "learning_rate": torch.tensor(self.optimizer.param_groups[0]["lr"])}

    def act_on(self, params: torch.Tensor, values: torch.Tensor, deterministic: bool = False,
               uniforms: torch.Tensor | None = None) -> ActOutput:
        """`act`'s draw from the policy head's parameters and the values a population computed for all members
        (`uniforms`: as PPO's)."""
        out = self.networks.sampled(params, values, deterministic, uniforms)
        return out if self.baseline else out._replace(values=torch.zeros_like(out.values))
