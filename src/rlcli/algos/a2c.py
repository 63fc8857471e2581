"""Advantage Actor-Critic (synchronous A2C) with GAE, one gradient step per rollout."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch

from rlcli.actors.mlp import ActorCritic, ActOutput
from rlcli.addons import addon_losses
from rlcli.algos.base import (
    Schedule,
    adam,
    check_common,
    clipped_env_actions,
    evaluate_batch,
    explained_variance,
    gradient_step,
    masked_mean,
    normalize_masked,
    param_groups,
    schedule_factor,
    set_lr,
)
from rlcli.buffers.rollout import RolloutBuffer
from rlcli.registry import ALGOS


@ALGOS.register("a2c")
class A2C:
    on_policy = True

    def __init__(
        self,
        actor: ActorCritic,
        num_envs: int,
        n_steps: int = 5,
        lr: float = 7e-4,
        lr_pi: float | None = None,
        lr_v: float | None = None,
        lr_schedule: Schedule = "constant",
        optimizer: Literal["rmsprop", "adam"] = "rmsprop",
        gamma: float = 0.99,
        gae_lambda: float = 1.0,
        normalize_advantage: bool = False,
        ent_coef: float = 0.0,
        vf_coef: float = 0.5,
        max_grad_norm: float | None = 0.5,
    ) -> None:
        check_common(n_steps, lr, lr_pi, lr_v, gamma, gae_lambda, ent_coef, vf_coef, max_grad_norm)
        self.actor = actor
        self.n_steps, self.gamma, self.gae_lambda = n_steps, gamma, gae_lambda
        self.lr_schedule, self.normalize_advantage = lr_schedule, normalize_advantage
        self.ent_coef, self.vf_coef, self.max_grad_norm = ent_coef, vf_coef, max_grad_norm
        groups = param_groups(actor, lr, lr_pi, lr_v)
        if optimizer == "rmsprop":  # SB3's (TF-like) settings, which A2C's published results use
            self.optimizer: torch.optim.Optimizer = torch.optim.RMSprop(groups, alpha=0.99, eps=1e-5)
        else:
            self.optimizer = adam(groups, eps=1e-5)

    @torch.inference_mode()
    def act(self, obs: torch.Tensor, deterministic: bool = False) -> ActOutput:
        return self.actor.act(obs, deterministic)

    def update(self, buffer: RolloutBuffer, progress: float) -> dict[str, torch.Tensor]:
        lr = set_lr(self.optimizer, schedule_factor(self.lr_schedule, progress))
        batch = buffer.flat()
        mask = batch.mask
        log_probs, entropy, values = evaluate_batch(self.actor, batch)
        advantages = batch.advantages
        if self.normalize_advantage:
            advantages = normalize_masked(advantages, mask)
        policy_loss = -masked_mean(advantages * log_probs, mask)
        extra, addon_logs = addon_losses(self, batch.obs, mask)
        policy_loss = policy_loss + extra
        value_loss = masked_mean((values - batch.returns).square(), mask)
        entropy_mean = masked_mean(entropy, mask)
        loss = policy_loss - self.ent_coef * entropy_mean + self.vf_coef * value_loss

        gradient_step(self.optimizer, loss, self.actor.parameters(), self.max_grad_norm)
        return {
            "policy_loss": policy_loss.detach(), "value_loss": value_loss.detach(),
            "entropy": entropy_mean.detach(), "loss": loss.detach(),
            "explained_variance": explained_variance(batch.values, batch.returns, mask),
            "learning_rate": torch.tensor(lr), **addon_logs,
        }

    def env_actions(self, actions: torch.Tensor) -> np.ndarray:
        return clipped_env_actions(self.actor, actions)

    def state_dict(self) -> dict[str, Any]:
        return {"actor": self.actor.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.actor.load_state_dict(state["actor"])
        self.optimizer.load_state_dict(state["optimizer"])
