"""Behavioural cloning: a policy fit to a dataset's actions, the floor every offline algorithm is compared with.

Box actions: a deterministic tanh policy in the unit box regressed onto the actions by mean squared error (CORL's
any_percent_bc). Discrete actions: a categorical policy fit by cross-entropy. It learns from the same replay
batches as any off-policy algorithm (offline/replay.py fills the storage from the dataset) and acts greedily.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlcli.actors.offpolicy import DeterministicPolicy, NetworkRecipe
from rlcli.algos.base import adam
from rlcli.algos.exploration import uniform_box_actions
from rlcli.algos.loss_step import LossStep
from rlcli.algos.offpolicy import (
    BoxScaler,
    StepOutput,
    check_offpolicy,
    resolve_gradient_steps,
)
from rlcli.algos.runner import Runner, single_run_update
from rlcli.contracts import ActOutput, AlgoSpec, RecurrentState, ReplayStorage, RunClock, SequenceStorage
from rlcli.registry import ALGOS, require


class BCNetworks(nn.Module):
    """The policy alone: tanh actions in the unit box (Box), or logits over the actions (Discrete)."""

    def __init__(self, torso: NetworkRecipe, outputs: int, box: bool):
        super().__init__()
        self.normalizer = torso.normalizer
        self.policy = DeterministicPolicy(torso, outputs) if box else torso.make(outputs, out_gain=0.01)


@ALGOS.register("bc", spec=AlgoSpec(on_policy=False, action_spaces=("Box", "Discrete"), networks=("mlp",),
                                    compiles=True, offline=True, population="lockstep"))
class BC:
    """Behavioural cloning (offline): the policy fit to a dataset's actions, by mean squared error (Box: a tanh policy
    in the unit box) or cross-entropy (Discrete); it acts greedily."""

    gamma = 0.99  # no loss reads it; the contract's replay discount, which the storage is built with

    def __init__(
        self,
        recipe: NetworkRecipe,
        action_space: gym.spaces.Space,
        num_envs: int,
        lr: float = 3e-4,  # Adam's step size (CORL's any_percent_bc)
        batch_size: int = 256,  # transitions per gradient step
        learning_starts: int = 0,  # an offline run learns from its first step
        train_freq: int = 1,  # loop steps between two updates (offline: one gradient step per loop step)
        gradient_steps: int = 1,  # gradient steps per update
        max_grad_norm: float | None = None,  # clip the gradient's global norm to this (null: no clip)
    ) -> None:
        check_offpolicy(lr, batch_size, learning_starts, train_freq, gradient_steps, self.gamma, 1.0, 1.0)
        require(max_grad_norm is None or max_grad_norm > 0, "algo.max_grad_norm", max_grad_norm, "must be > 0 or null")
        self.box = isinstance(action_space, gym.spaces.Box)
        self.scaler = BoxScaler(action_space) if self.box else None
        self.action_dim = int(np.prod(action_space.shape)) if self.box else int(action_space.n)  # type: ignore[attr-defined]
        self.networks = BCNetworks(recipe, self.action_dim, self.box)
        self.optimizer = adam(self.networks.policy.parameters(), lr=lr)
        self.steps_per_collect, self.episodes_per_collect = train_freq, 0
        self.batch_size, self.learning_starts, self.max_grad_norm = batch_size, learning_starts, max_grad_norm
        self.gradient_steps = resolve_gradient_steps(gradient_steps, train_freq, num_envs)
        self.default_schedules: dict[str, Any] = {}
        self.schedulable: tuple[str, ...] = ("max_grad_norm",)
        self.train_step = LossStep(self.networks, self.optimizer, self.loss, clip_of=self)
        self.gradient_updates = 0

    def loss(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, tuple[()]]:
        """MSE to the dataset's unit-box actions (Box), or cross-entropy to its action indices (Discrete)."""
        out = self.networks.policy(obs)
        if self.box:
            return nn.functional.mse_loss(out, actions), ()
        return nn.functional.cross_entropy(out, actions.long()), ()

    @torch.inference_mode()
    def act(self, obs: torch.Tensor, deterministic: bool = False, state: RecurrentState | None = None) -> ActOutput:
        """The policy's action either way: the cloned behaviour has no exploration of its own."""
        out = self.networks.policy(obs)
        actions = out if self.box else out.argmax(-1)
        zeros = torch.zeros(out.shape[0], device=out.device)
        return ActOutput(actions, zeros, zeros)

    def random_actions(self, n: int) -> torch.Tensor:
        return uniform_box_actions(n, self.action_dim) if self.box else torch.randint(0, self.action_dim, (n,))

    def env_actions(self, actions: torch.Tensor) -> torch.Tensor:
        return actions if self.scaler is None else self.scaler.to_env(actions)

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer]

    def update(self, buffer: ReplayStorage | SequenceStorage, clock: RunClock) -> dict[str, torch.Tensor]:
        return single_run_update(self, buffer, clock)

    def _gradient_step(self, batch: Any, run: Runner) -> StepOutput:
        loss, _ = run(self.train_step, batch.obs, batch.actions)
        self.gradient_updates += 1
        return None, {"policy_loss": loss.detach()}

    def state_dict(self) -> dict[str, Any]:
        return {"networks": self.networks.state_dict(), "optimizer": self.optimizer.state_dict(),
                "gradient_updates": self.gradient_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.networks.load_state_dict(state["networks"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.gradient_updates = int(state.get("gradient_updates", 0))  # (counted since 2026-11-28)
