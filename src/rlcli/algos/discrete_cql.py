"""Conservative Q-Learning for Discrete actions (Kumar et al. 2020, CQL(H) on a DQN): the Q-learning loss plus
alpha x (logsumexp over actions of Q(s, .) - Q(s, a_data)), which lowers every action's value but the dataset's, so
the greedy policy stays on actions the data backs. Kumar et al.'s QR-DQN variant is not built; `double`, `dueling`
and the Huber loss are DQN's options. Box actions: cql.py.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch

from rlcli.actors.offpolicy import NetworkRecipe
from rlcli.algos.dqn import DQN, q_learning_target, q_regression_loss
from rlcli.contracts import AlgoSpec
from rlcli.registry import ALGOS, require


def discrete_cql_penalty(q: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """[B] logsumexp_a Q(s, a) - Q(s, a_data), from Q-values [B, n_actions] and the dataset's actions [B]."""
    return torch.logsumexp(q, -1) - q.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)


@ALGOS.register("discrete_cql", spec=AlgoSpec(on_policy=False, action_spaces=("Discrete",), networks=("mlp",),
                                              compiles=True, offline=True, population="lockstep"))
class DiscreteCQL(DQN):
    """Conservative Q-Learning for Discrete actions (Kumar et al. 2020, offline): DQN plus cql_alpha x (logsumexp of
    Q(s, .) - Q(s, a_data))."""

    def __init__(
        self,
        recipe: NetworkRecipe,
        action_space: gym.spaces.Space,
        num_envs: int,
        lr: float = 3e-4,
        batch_size: int = 256,
        learning_starts: int = 0,  # offline: learn from the first step
        train_freq: int = 1,  # loop steps between update phases (offline: one gradient step per loop step)
        gradient_steps: int = 1,  # gradient steps per update phase
        tau: float = 0.005,  # target network's Polyak weight (1 = hard copy)
        target_update_interval: int = 1,  # steps between target updates (DQN counts env steps; offline: loop steps)
        cql_alpha: float = 1.0,  # the penalty's weight (Kumar et al.'s discrete experiments: 0.5-4)
        exploration_initial_eps: float = 0.05,  # acting online after the dataset (offline.online_steps): DQN's final
                                                # epsilon from the start
        max_grad_norm: float | None = None,  # global grad-norm clip of each step (null: none)
        **dqn_settings: Any,
    ) -> None:
        require(cql_alpha >= 0, "algo.cql_alpha", cql_alpha, "must be >= 0 (0: plain DQN)")
        self.cql_alpha = cql_alpha
        super().__init__(recipe, action_space, num_envs, lr=lr, batch_size=batch_size, learning_starts=learning_starts,
                         train_freq=train_freq, gradient_steps=gradient_steps, tau=tau,
                         target_update_interval=target_update_interval,
                         exploration_initial_eps=exploration_initial_eps, max_grad_norm=max_grad_norm, **dqn_settings)
        self.schedulable += ("cql_alpha",)

    def transition_loss(self, batch: Any) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """DQN's loss plus cql_alpha x the batch mean of the penalty; with each transition's TD error and the mean Q
        of the dataset's actions."""
        net = self.networks
        with torch.no_grad():
            target = q_learning_target(batch.rewards, batch.discounts, net.q_target(batch.next_obs),
                                       net.q(batch.next_obs) if self.double else None, self.reward_scale)
        q_all = net.q(batch.obs)
        q = q_all.gather(-1, batch.actions.long().unsqueeze(-1)).squeeze(-1)
        td = (batch.weights * q_regression_loss(q, target, self.loss)).mean()
        penalty = discrete_cql_penalty(q_all, batch.actions).mean()
        return td + self.cql_alpha * penalty, ((q - target).detach(), q.detach().mean())
