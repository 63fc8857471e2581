"""A complete algorithm in one file: vanilla policy gradient with a learned baseline.

What rlcli asks of an algorithm (rlcli/contracts.py): register the class with a name and an
`AlgoSpec` saying what it needs; take the built networks (on-policy) or a network recipe
(off-policy) plus `num_envs` as constructor arguments, and everything else as config keys with
types and defaults (they are checked and listed in errors); then `act`, `env_actions`,
`finish_rollout` (on-policy) or `random_actions` (off-policy), `update`, `state_dict` and
`load_state_dict`, `default_schedules` (the values over the run its settings imply), `schedulable` (the
settings `algo.schedules` may move) and `optimizers()`. The clock comes in as an argument; nothing is set on
the object from outside but its scheduled values.
"""

from __future__ import annotations

from typing import Any

import torch

from rlcli.actors.mlp import ActorCritic
from rlcli.algos.base import finish_with_gae, masked_mean
from rlcli.buffers.rollout import RolloutBuffer
from rlcli.contracts import ActOutput, AlgoSpec, RecurrentState, RunClock
from rlcli.registry import ALGOS, require
from rlcli.schedules import Schedule


@ALGOS.register("vpg_example", spec=AlgoSpec(on_policy=True, action_spaces=("Discrete",), networks=("mlp",)))
class VanillaPolicyGradient:
    def __init__(self, networks: ActorCritic, num_envs: int, n_steps: int = 128, lr: float = 3e-3,
                 gamma: float = 0.99) -> None:
        require(n_steps > 0, "algo.n_steps", n_steps, "must be > 0")
        require(lr > 0, "algo.lr", lr, "must be > 0")
        self.networks, self.n_steps, self.gamma, self.gae_lambda = networks, n_steps, gamma, 1.0
        self.steps_per_collect = n_steps  # env steps per env in one collect phase: the rollout
        self.optimizer = torch.optim.Adam(networks.parameters(), lr=lr)
        self.default_schedules: dict[str, Schedule] = {}  # none; users may still set algo.schedules.lr
        self.schedulable = ("gamma",)

    @torch.inference_mode()
    def act(self, obs: torch.Tensor, deterministic: bool = False, state: RecurrentState | None = None) -> ActOutput:
        return self.networks.act(obs, deterministic)

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer]

    def env_actions(self, actions: torch.Tensor) -> torch.Tensor:
        return actions

    def finish_rollout(self, buffer: RolloutBuffer, last_obs: torch.Tensor, state: RecurrentState | None) -> None:
        finish_with_gae(self.networks.value, buffer, last_obs, state, self.gamma, self.gae_lambda)

    def update(self, buffer: RolloutBuffer, clock: RunClock) -> dict[str, torch.Tensor]:
        batch = buffer.flat()
        log_probs, _, values = self.networks.evaluate(batch.obs, batch.actions)
        advantages = (batch.advantages - batch.advantages.mean()) / (batch.advantages.std() + 1e-8)
        policy_loss = -masked_mean(advantages * log_probs, batch.mask)
        value_loss = masked_mean((values - batch.returns).square(), batch.mask)
        self.optimizer.zero_grad()
        (policy_loss + 0.5 * value_loss).backward()
        self.optimizer.step()
        return {"policy_loss": policy_loss.detach(), "value_loss": value_loss.detach()}

    def state_dict(self) -> dict[str, Any]:
        return {"networks": self.networks.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.networks.load_state_dict(state["networks"])
        self.optimizer.load_state_dict(state["optimizer"])
