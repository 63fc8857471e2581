"""The update of A2C and PG: one gradient step on the whole rollout, written for a runner (algos/runner.py)."""

from __future__ import annotations

from typing import Any

import torch

from rlcli.algos.addons import addon_coefs
from rlcli.algos.base import GaeActorCritic, clipped_env_actions, refuse_in_population, set_lr
from rlcli.algos.runner import single_rollout_update
from rlcli.batches import RolloutBatch


class OneStepUpdate(GaeActorCritic):
    """The update of A2C and PG: one gradient step on the whole rollout, with their one optimizer's checkpoint
    state; the algorithm supplies `minibatch_loss` (over ent_coef and vf_coef) and `update_metrics`."""

    networks: Any
    optimizer: Any
    policy_addons: list[Any]
    lr_scale: float
    ent_coef: float
    vf_coef: float
    max_grad_norm: float | None
    train_step: Any  # a LossStep over minibatch_loss (algos/loss_step.py), which the algorithm builds
    member_settings = {"lr_scale": "lr_scale", "ent_coef": "ent_coef", "vf_coef": "vf_coef",
                       "gae_lambda": "gae_lambda"}  # what members of a population may differ in: read per member

    def update(self, buffer: Any, clock: Any) -> dict[str, torch.Tensor]:
        return single_rollout_update(self, buffer, clock)

    def _update(self, batch: RolloutBatch, run: Any) -> dict[str, torch.Tensor]:
        ent_coef, vf_coef = run.read(self.settings)
        _, stats = run(self.train_step, batch, ent_coef, vf_coef, addon_coefs(self.policy_addons))
        return {**stats, **run.read(self.update_metrics, batch)}

    def settings(self) -> tuple[float, float]:
        """The loss coefficients; the learning rate set as the schedule has it now."""
        set_lr(self.optimizer, self.lr_scale)
        return self.ent_coef, self.vf_coef

    def population_refusal(self) -> str | None:
        return refuse_in_population(self.networks, self.policy_addons)

    def minibatch_loss(self, batch: RolloutBatch, ent_coef: float | torch.Tensor, vf_coef: float | torch.Tensor,
                       addon_coefs: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise NotImplementedError

    def update_metrics(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer]

    def env_actions(self, actions: torch.Tensor) -> torch.Tensor:
        return clipped_env_actions(self.networks, actions)

    def state_dict(self) -> dict[str, Any]:
        return {"networks": self.networks.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.networks.load_state_dict(state["networks"])
        self.optimizer.load_state_dict(state["optimizer"])
