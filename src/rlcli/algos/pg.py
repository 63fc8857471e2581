"""Vanilla policy gradient (REINFORCE, Williams 1992), with an optional learned baseline.

Per rollout: discounted returns-to-go (GAE with lambda = 1), one gradient step on
-log pi(a|s) * (G - b(s)). With `baseline: false` the value head is not trained and
b = 0: the advantage is the plain return, bootstrapped with 0 where a rollout cuts an episode,
so give it rollouts longer than the episodes (n_steps x num_envs) or keep the baseline.
"""

from __future__ import annotations

from typing import Any

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


@ALGOS.register("pg")
class PolicyGradient:
    on_policy = True

    def __init__(
        self,
        actor: ActorCritic,
        num_envs: int,
        n_steps: int = 500,
        lr: float = 1e-2,
        lr_pi: float | None = None,
        lr_v: float | None = None,
        lr_schedule: Schedule = "constant",
        gamma: float = 0.99,
        baseline: bool = True,
        normalize_advantage: bool = True,
        ent_coef: float = 0.0,
        vf_coef: float = 0.5,
        max_grad_norm: float | None = None,
    ) -> None:
        check_common(n_steps, lr, lr_pi, lr_v, gamma, 1.0, ent_coef, vf_coef, max_grad_norm)
        self.actor = actor
        self.n_steps, self.gamma, self.gae_lambda = n_steps, gamma, 1.0
        self.lr_schedule, self.baseline, self.normalize_advantage = lr_schedule, baseline, normalize_advantage
        self.ent_coef, self.vf_coef, self.max_grad_norm = ent_coef, vf_coef, max_grad_norm
        self.optimizer = adam(param_groups(actor, lr, lr_pi, lr_v))

    @torch.inference_mode()
    def act(self, obs: torch.Tensor, deterministic: bool = False) -> ActOutput:
        out = self.actor.act(obs, deterministic)
        if self.baseline:
            return out
        return ActOutput(out.actions, out.log_probs, torch.zeros_like(out.values))  # b(s) = 0: plain returns

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """The baseline the collector bootstraps cut-off rollouts with: 0 without a baseline."""
        values = self.actor.value(obs)
        return values if self.baseline else torch.zeros_like(values)

    def update(self, buffer: RolloutBuffer, progress: float) -> dict[str, torch.Tensor]:
        lr = set_lr(self.optimizer, schedule_factor(self.lr_schedule, progress))
        batch = buffer.flat()
        mask = batch.mask
        log_probs, entropy, values = evaluate_batch(self.actor, batch)
        advantages = batch.advantages  # G - b(s) (b = 0 without a baseline)
        if self.normalize_advantage:
            advantages = normalize_masked(advantages, mask)
        policy_loss = -masked_mean(advantages * log_probs, mask)
        extra, addon_logs = addon_losses(self, batch.obs, mask)
        policy_loss = policy_loss + extra
        entropy_mean = masked_mean(entropy, mask)
        loss = policy_loss - self.ent_coef * entropy_mean
        metrics = {"policy_loss": policy_loss.detach(), "entropy": entropy_mean.detach()}
        if self.baseline:
            value_loss = masked_mean((values - batch.returns).square(), mask)
            loss = loss + self.vf_coef * value_loss
            metrics["value_loss"] = value_loss.detach()
            metrics["explained_variance"] = explained_variance(batch.values, batch.returns, mask)
        gradient_step(self.optimizer, loss, self.actor.parameters(), self.max_grad_norm)
        metrics.update(loss=loss.detach(), learning_rate=torch.tensor(lr), **addon_logs)
        return metrics

    def env_actions(self, actions: torch.Tensor) -> np.ndarray:
        return clipped_env_actions(self.actor, actions)

    def state_dict(self) -> dict[str, Any]:
        return {"actor": self.actor.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.actor.load_state_dict(state["actor"])
        self.optimizer.load_state_dict(state["optimizer"])
