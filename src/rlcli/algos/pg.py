"""Vanilla policy gradient (REINFORCE, Williams 1992), with an optional learned baseline: A2C's update with
lambda = 1 and Adam.

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
from rlcli.algos.a2c import A2C
from rlcli.algos.addons import PolicyAddon
from rlcli.algos.base import Decay, adam, finish_with_gae
from rlcli.algos.losses import policy_gradient_terms
from rlcli.batches import RolloutBatch
from rlcli.contracts import ON_POLICY_ACTIONS, ActOutput, AlgoSpec, RecurrentState, RolloutStorage
from rlcli.registry import ALGOS


@ALGOS.register("pg", spec=AlgoSpec(on_policy=True, compiles=True, action_spaces=ON_POLICY_ACTIONS,
                                    population="on_policy"))
class PolicyGradient(A2C):
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
        super().__init__(networks, num_envs, policy_addons, n_steps=n_steps, lr=lr, lr_pi=lr_pi, lr_v=lr_v,
                         lr_schedule=lr_schedule, optimizer="adam", gamma=gamma, gae_lambda=1.0,
                         normalize_advantage=normalize_advantage, ent_coef=ent_coef, vf_coef=vf_coef,
                         max_grad_norm=max_grad_norm)
        self.baseline = baseline
        self.schedulable = ("lr_scale", "ent_coef", "vf_coef", "gamma", "max_grad_norm")

    def make_optimizer(self, groups: list[dict[str, Any]], optimizer: str) -> Any:
        return adam(groups)  # Adam's own eps (A2C's Adam takes RMSprop's 1e-5)

    @torch.inference_mode()
    def act(self, obs: torch.Tensor, deterministic: bool = False, state: RecurrentState | None = None) -> ActOutput:
        out = self.networks.act(obs, deterministic, state)
        return out if self.baseline else out._replace(values=torch.zeros_like(out.values))  # b(s) = 0: plain returns

    def value(self, obs: torch.Tensor, state: RecurrentState | None = None) -> torch.Tensor:
        """The baseline that cut-off rollouts are bootstrapped with: 0 without a baseline."""
        values = self.networks.value(obs, state)
        return values if self.baseline else torch.zeros_like(values)

    def finish_rollout(self, buffer: RolloutStorage, last_obs: torch.Tensor, state: RecurrentState | None) -> None:
        finish_with_gae(self.value, buffer, last_obs, state, self.gamma, self.gae_lambda)

    def minibatch_loss(self, batch: RolloutBatch, ent_coef: float | torch.Tensor, vf_coef: float | torch.Tensor,
                       addon_coefs: Sequence[Any] | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """A2C's loss; without a baseline no value term (the advantages are plain returns, the value head untouched)."""
        if self.baseline:
            return super().minibatch_loss(batch, ent_coef, vf_coef, addon_coefs)
        policy_loss, entropy_mean, _, addon_logs = policy_gradient_terms(
            self.networks, batch, self.policy_addons, self.normalize_advantage, addon_coefs)
        loss = policy_loss - ent_coef * entropy_mean
        return loss, {"policy_loss": policy_loss.detach(), "entropy": entropy_mean.detach(), "loss": loss.detach(),
                      **addon_logs}

    def update_metrics(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        metrics = super().update_metrics(batch)
        if not self.baseline:
            del metrics["explained_variance"]
        return metrics

    def act_on(self, params: torch.Tensor, values: torch.Tensor, deterministic: bool = False,
               uniforms: torch.Tensor | None = None) -> ActOutput:
        out = super().act_on(params, values, deterministic, uniforms)
        return out if self.baseline else out._replace(values=torch.zeros_like(out.values))
