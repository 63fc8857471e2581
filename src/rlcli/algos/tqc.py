"""Truncated Quantile Critics (Kuznetsov et al. 2020): SAC whose critics each predict `n_quantiles`
quantiles of the return; the target pools every critic's quantiles at the next state, sorts them and
drops the largest `top_quantiles_to_drop_per_net` x critics of them, which controls overestimation
more finely than SAC's minimum over two critics. The policy climbs the mean of all quantiles.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch

from rlcli.actors.offpolicy import NetworkRecipe
from rlcli.algos.losses import quantile_huber_loss
from rlcli.algos.sac import SAC
from rlcli.contracts import AlgoSpec
from rlcli.registry import ALGOS, require


def truncated_targets(next_quantiles: torch.Tensor, drop_per_net: int) -> torch.Tensor:
    """[N, B, Q] critics' quantiles -> [B, N * Q - N * drop] smallest pooled quantiles, sorted."""
    n_critics, batch, n = next_quantiles.shape
    pooled = next_quantiles.permute(1, 0, 2).reshape(batch, n_critics * n)
    return pooled.sort(-1).values[:, : n_critics * (n - drop_per_net)]


@ALGOS.register("tqc", spec=AlgoSpec(on_policy=False, action_spaces=("Box",), networks=("mlp", "cnn"),
                                      compiles=True, population="lockstep"))
class TQC(SAC):
    def __init__(
        self,
        recipe: NetworkRecipe,
        action_space: gym.spaces.Space,
        num_envs: int,
        n_quantiles: int = 25,  # quantiles each critic predicts
        top_quantiles_to_drop_per_net: int = 2,  # the target drops this many x num_critics of the largest pooled
                                                 # quantiles
        **sac_settings: Any,
    ) -> None:
        require(n_quantiles >= 1, "algo.n_quantiles", n_quantiles, "must be >= 1")
        require(0 <= top_quantiles_to_drop_per_net < n_quantiles, "algo.top_quantiles_to_drop_per_net",
                top_quantiles_to_drop_per_net, f"must be in [0, algo.n_quantiles={n_quantiles})")
        self.n_quantiles, self.drop_per_net = n_quantiles, top_quantiles_to_drop_per_net
        super().__init__(recipe, action_space, num_envs, **sac_settings)

    def critic_outputs(self) -> int:
        return self.n_quantiles

    def critic_loss(self, batch: Any, next_actions: torch.Tensor, next_log_probs: torch.Tensor,
                    alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        net = self.networks
        with torch.no_grad():
            pooled = truncated_targets(net.critics_target(batch.next_obs, next_actions), self.drop_per_net)
            target = (self.reward_scale * batch.rewards.unsqueeze(-1)
                      + batch.discounts.unsqueeze(-1) * (pooled - alpha * next_log_probs.unsqueeze(-1)))
        quantiles = net.critics(batch.obs, batch.actions)  # [N, B, Q]
        per_sample = quantile_huber_loss(quantiles, target)
        errors = (quantiles.detach().mean((0, 2)) - target.mean(-1)).abs()  # PER: |mean quantile - mean target|
        return (batch.weights * per_sample).mean(), errors

    def policy_q(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.networks.critics(obs, actions).mean((0, 2))
