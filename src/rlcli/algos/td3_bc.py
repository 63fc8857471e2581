"""TD3+BC (Fujimoto & Gu 2021): TD3 on a dataset, its policy also pulled toward the dataset's actions.

The critics learn as TD3's do (twin critics, target policy smoothing, delayed policy and target updates; algos/td3.py);
only the policy's loss changes: -lambda * Q1(s, pi(s)).mean() + mse(pi(s), a), with lambda = alpha / mean|Q1|
(detached), so that alpha weighs the two terms whatever the scale of the rewards.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch

from rlcli.actors.offpolicy import NetworkRecipe
from rlcli.algos.td3 import TD3
from rlcli.contracts import AlgoSpec
from rlcli.registry import ALGOS, require

OFFLINE_TD3 = AlgoSpec(on_policy=False, action_spaces=("Box",), networks=("mlp",), compiles=True, offline=True,
                       population="lockstep")


class BehaviorRegularizedTD3(TD3):
    """TD3 whose losses also read the dataset: the policy's takes the batch's actions (its `policy_loss(obs,
    actions) -> (loss, bc_loss)`, bc_loss being its behaviour-cloning term unweighted, logged), the critics' may take
    more (`critic_inputs`, after the batch and the smoothing's draws). What TD3+BC and ReBRAC share; not registered."""

    def policy_loss(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def policy_inputs(self, batch: Any) -> tuple[torch.Tensor, ...]:
        return batch.obs, batch.actions

    def policy_metrics(self, aux: Any) -> dict[str, torch.Tensor]:
        return {"bc_loss": aux}


@ALGOS.register("td3_bc", spec=OFFLINE_TD3)
class TD3BC(BehaviorRegularizedTD3):
    """TD3+BC (Fujimoto & Gu 2021, offline): TD3 whose policy loss adds the squared distance to the dataset's action
    and weighs Q by alpha / mean|Q|."""

    def __init__(
        self,
        recipe: NetworkRecipe,
        action_space: gym.spaces.Space,
        num_envs: int,
        alpha: float = 2.5,  # the Q term's weight against the BC term: lambda = alpha / (mean absolute Q)
        lr: float = 3e-4,  # Adam's step size, policy and critics
        batch_size: int = 256,  # transitions per gradient step
        learning_starts: int = 0,  # an offline run learns from its first step
        **td3_settings: Any,
    ) -> None:
        require(alpha >= 0, "algo.alpha", alpha, "must be >= 0 (the weight of Q against the BC term)")
        self.alpha = alpha
        super().__init__(recipe, action_space, num_envs, lr=lr, batch_size=batch_size,
                         learning_starts=learning_starts, **td3_settings)
        self.schedulable = (*self.schedulable, "alpha")
        self.build_steps(self.critic_loss, self.policy_loss)

    def policy_loss(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-lambda * Q1(s, pi(s)).mean() + mse(pi(s), a), lambda = alpha / mean|Q1| (detached); and the mse."""
        net = self.networks
        pi = net.policy(obs)
        q = net.critics.nets[0](obs, pi)
        lmbda = self.alpha / q.abs().mean().detach()
        mse = (pi - actions).square().mean()
        return -lmbda * q.mean() + mse, mse.detach()
