"""Advantage Actor-Critic (synchronous A2C) with GAE, one gradient step per rollout."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch

from rlcli.actors.mlp import ActorCritic
from rlcli.actors.sde import NoiseResampling, head_noise
from rlcli.algos.addons import PolicyAddon
from rlcli.algos.base import (
    Decay,
    adam,
    check_common,
    explained_variance,
    param_groups,
)
from rlcli.algos.loss_step import LossStep
from rlcli.algos.losses import policy_gradient_terms, squared_value_loss
from rlcli.algos.one_step import OneStepUpdate
from rlcli.algos.optim import RMSprop
from rlcli.batches import RolloutBatch
from rlcli.contracts import ON_POLICY_ACTIONS, AlgoSpec
from rlcli.registry import ALGOS
from rlcli.schedules import to_zero


@ALGOS.register("a2c", spec=AlgoSpec(on_policy=True, compiles=True, action_spaces=ON_POLICY_ACTIONS,
                                     population="on_policy"))
class A2C(OneStepUpdate):
    def __init__(
        self,
        networks: ActorCritic,
        num_envs: int,
        policy_addons: Sequence[PolicyAddon] = (),
        n_steps: int = 5,
        lr: float = 7e-4,
        lr_pi: float | None = None,  # separate policy / value learning rates (default: lr)
        lr_v: float | None = None,
        lr_schedule: Decay = "constant",
        optimizer: Literal["rmsprop", "adam"] = "rmsprop",  # rmsprop (alpha 0.99, eps 1e-5, as SB3) | adam
        gamma: float = 0.99,
        gae_lambda: float = 1.0,
        normalize_advantage: bool = False,
        ent_coef: float = 0.0,
        vf_coef: float = 0.5,
        max_grad_norm: float | None = 0.5,
        use_sde: bool = False,  # gSDE (Raffin et al. 2021): state-dependent exploration noise, Box actions, actor=mlp
        sde_sample_freq: int = -1,  # gSDE: new noise matrices every n steps (-1: once per collect phase)
    ) -> None:
        check_common(n_steps, lr, lr_pi, lr_v, gamma, gae_lambda, ent_coef, vf_coef, max_grad_norm)
        self.networks = networks
        self.policy_addons = list(policy_addons)  # extra policy-loss terms (rlcli/algos/addons.py)
        self.n_steps, self.gamma, self.gae_lambda = n_steps, gamma, gae_lambda
        self.steps_per_collect = n_steps
        self.noise_resampling = NoiseResampling(head_noise(networks.head, use_sde), n_steps, sde_sample_freq)
        self.normalize_advantage = normalize_advantage
        self.lr_scale = 1.0  # lr_schedule=linear: a factor from 1 to 0, set by the trainer's schedules
        linear = to_zero(lr_schedule)
        self.default_schedules = {"lr_scale": linear} if linear else {}
        self.ent_coef, self.vf_coef, self.max_grad_norm = ent_coef, vf_coef, max_grad_norm
        self.schedulable: tuple[str, ...] = ("lr_scale", "ent_coef", "vf_coef", "gamma", "gae_lambda", "max_grad_norm")
        self.optimizer = self.make_optimizer(param_groups(networks, lr, lr_pi, lr_v), optimizer)
        self.train_step = LossStep(networks, self.optimizer, self.minibatch_loss, clip_of=self)

    def make_optimizer(self, groups: list[dict[str, Any]], optimizer: str) -> Any:
        if optimizer == "rmsprop":  # SB3's (TF-like) settings, which A2C's published results use
            return RMSprop(groups, alpha=0.99, eps=1e-5)
        return adam(groups, eps=1e-5)

    def minibatch_loss(self, batch: RolloutBatch, ent_coef: float | torch.Tensor, vf_coef: float | torch.Tensor,
                       addon_coefs: Sequence[Any] | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        policy_loss, entropy_mean, values, addon_logs = policy_gradient_terms(
            self.networks, batch, self.policy_addons, self.normalize_advantage, addon_coefs)
        value_loss = squared_value_loss(values, batch.returns, batch.mask)
        loss = policy_loss - ent_coef * entropy_mean + vf_coef * value_loss
        return loss, {"policy_loss": policy_loss.detach(), "value_loss": value_loss.detach(),
                      "entropy": entropy_mean.detach(), "loss": loss.detach(), **addon_logs}

    def update_metrics(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        return {"explained_variance": explained_variance(batch.values, batch.returns, batch.mask),
                "learning_rate": torch.tensor(self.optimizer.param_groups[0]["lr"])}

