"""Quantile Regression DQN (Dabney et al. 2018): the Q-network predicts `n_quantiles` quantiles of each
action's return, learned by quantile Huber regression toward the target network's quantiles of the
greedy next action; actions are chosen by the quantiles' mean. As sb3-contrib's QR-DQN.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch

from rlcli.actors.offpolicy import NetworkRecipe
from rlcli.algos.dqn import DQN
from rlcli.algos.losses import quantile_huber_loss
from rlcli.contracts import AlgoSpec
from rlcli.registry import ALGOS, require


@ALGOS.register("qrdqn", spec=AlgoSpec(on_policy=False, action_spaces=("Discrete",), networks=("mlp", "cnn"),
                                       compiles=True, population="lockstep"))
class QRDQN(DQN):
    def __init__(
        self,
        recipe: NetworkRecipe,
        action_space: gym.spaces.Space,
        num_envs: int,
        n_quantiles: int = 200,  # quantiles of each action's return
        lr: float = 5e-5,
        target_update_interval: int = 10_000,  # env steps between target updates (as in SB3)
        exploration_fraction: float = 0.005,  # fraction of train.total_steps over which epsilon decays
        exploration_final_eps: float = 0.01,
        max_grad_norm: float | None = None,
        **dqn_settings: Any,
    ) -> None:
        """sb3-contrib's QRDQN defaults where they differ from DQN's (conf/algo/qrdqn.yaml says the same)."""
        require(n_quantiles >= 1, "algo.n_quantiles", n_quantiles, "must be >= 1")
        require(not dqn_settings.get("dueling", False), "algo.dueling", True, "is not built for quantile networks")
        require(dqn_settings.get("loss", "huber") == "huber", "algo.loss", dqn_settings.get("loss"),
                "QR-DQN always learns with the quantile Huber loss")
        self.n_quantiles = n_quantiles
        super().__init__(recipe, action_space, num_envs, lr=lr, target_update_interval=target_update_interval,
                         exploration_fraction=exploration_fraction, exploration_final_eps=exploration_final_eps,
                         max_grad_norm=max_grad_norm, **dqn_settings)

    def outputs_per_action(self) -> int:
        return self.n_quantiles

    def quantiles(self, obs: torch.Tensor, target: bool = False) -> torch.Tensor:
        """[B, actions, quantiles] of the online (or target) network."""
        out = (self.networks.q_target if target else self.networks.q)(obs)
        return out.view(out.shape[0], self.n_actions, self.n_quantiles)

    def q_values(self, obs: torch.Tensor, target: bool = False) -> torch.Tensor:
        return self.quantiles(obs, target).mean(-1)

    def transition_loss(self, batch: Any) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        with torch.no_grad():
            next_quantiles = self.quantiles(batch.next_obs, target=True)
            # the greedy next action by mean quantile: of the target net, or (double) of the online net
            chooser = self.q_values(batch.next_obs) if self.double else next_quantiles.mean(-1)
            best = chooser.argmax(-1)
            next_taken = next_quantiles[torch.arange(len(best), device=best.device), best]  # [B, Q]
            target = self.reward_scale * batch.rewards.unsqueeze(-1) + batch.discounts.unsqueeze(-1) * next_taken
        actions = batch.actions.long()
        current = self.quantiles(batch.obs)[torch.arange(len(actions), device=actions.device), actions]  # [B, Q]
        per_sample = quantile_huber_loss(current, target)
        errors = current.detach().mean(-1) - target.mean(-1)
        return (batch.weights * per_sample).mean(), (errors, current.detach().mean())
