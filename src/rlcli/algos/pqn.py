"""PQN, parallel Q-learning (Gallici et al. 2024, "Simplifying Deep Temporal Difference Learning").

No replay buffer and no target network: epsilon-greedy rollouts from many vector envs fill the
rollout storage, Q(lambda) returns are computed over each rollout from the Q-values seen while
acting, and the Q-network (LayerNorm after every hidden layer, which is what keeps TD learning
stable without a target network) regresses Q(s, a) onto them for a few epochs of minibatches.
It is on-policy-shaped in rlcli's loop: collect a rollout, finish it, update, discard it.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from rlcli.actors.layers import _ACTIVATIONS
from rlcli.actors.offpolicy import NetworkRecipe
from rlcli.algos.base import Decay, masked_mean, set_lr
from rlcli.algos.exploration import epsilon_greedy, minibatches
from rlcli.algos.loss_step import LossStep
from rlcli.algos.optim import RAdam
from rlcli.algos.runner import Runner, batch_rows, single_rollout_update
from rlcli.batches import RolloutBatch
from rlcli.contracts import ActOutput, AlgoSpec, RecurrentState, RolloutStorage, RunClock
from rlcli.registry import ALGOS, require
from rlcli.schedules import Schedule, to_zero


def q_lambda_returns(rewards: torch.Tensor, values: torch.Tensor, terminated: torch.Tensor, dones: torch.Tensor,
                     last_values: torch.Tensor, gamma: float, q_lambda: float) -> torch.Tensor:
    """Peng's Q(lambda) returns over a [T, N] rollout, from the greedy values max_a Q(s_t, a) stored at
    acting time (`values[t + 1]`, or `last_values` after the last step, is the value of what step t saw next):

        G_t = r_t + gamma * (1 - terminated_t) * [(1 - lambda) max Q(s_t+1) + lambda G_t+1]

    where an episode boundary (terminated or truncated) cuts the lambda tail: a truncated step bootstraps
    from max Q(final observation) alone, a terminated one from nothing, and G_T = max Q(s_T)."""
    next_values = torch.cat([values[1:], last_values.unsqueeze(0)], 0)
    returns = torch.empty_like(rewards)
    following = last_values  # G_{t+1}
    for t in range(rewards.shape[0] - 1, -1, -1):
        tail = q_lambda * (1.0 - dones[t])  # no lambda tail across an episode boundary
        bootstrap = (1.0 - tail) * next_values[t] + tail * following
        following = rewards[t] + gamma * (1.0 - terminated[t]) * bootstrap
        returns[t] = following
    return returns


class LayerNormQNetwork(nn.Module):
    """Q-values of every discrete action: [Linear -> LayerNorm -> activation] per hidden layer (over an
    image encoder's features for actor=cnn), then a linear layer to the actions."""

    def __init__(self, recipe: NetworkRecipe, n_actions: int) -> None:
        super().__init__()
        self.normalizer = recipe.normalizer
        layers: list[nn.Module] = []
        width = recipe.obs_dim
        if recipe.encoder is not None:
            encoder, width = recipe.encoder()
            layers.append(encoder)
        for size in recipe.hidden_sizes:
            linear = nn.Linear(width, size)
            if recipe.ortho_init:
                nn.init.orthogonal_(linear.weight, math.sqrt(2))
                nn.init.zeros_(linear.bias)
            layers += [linear, nn.LayerNorm(size), _ACTIVATIONS[recipe.activation]()]
            width = size
        out = nn.Linear(width, n_actions)
        if recipe.ortho_init:
            nn.init.orthogonal_(out.weight, math.sqrt(2))
            nn.init.zeros_(out.bias)
        self.q = nn.Sequential(nn.Flatten() if recipe.encoder is None else nn.Identity(), *layers, out)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.q(obs)

    def policy_and_values(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Acting's arithmetic without the draw: the Q-values and the greedy values (a population computes this for
        all its members at once, then each member acts on its rows with `PQN.act_on`)."""
        q = self.q(obs)
        return q, q.max(-1).values


@ALGOS.register("pqn", spec=AlgoSpec(on_policy=True, action_spaces=("Discrete",), networks=("mlp", "cnn"),
                                     network_kind="recipe", compiles=True, population="on_policy",
                                     rollout_returns=False))
class PQN:
    """Its update is written for a runner (algos/runner.py), as PPO's is."""

    member_settings = {"lr_scale": "lr_scale", "epsilon": "exploration_*", "q_lambda": "q_lambda"}

    def __init__(
        self,
        recipe: NetworkRecipe,
        action_space: gym.spaces.Space,
        num_envs: int,
        n_steps: int = 128,  # env steps per env between updates
        num_minibatches: int = 4,  # minibatches per epoch over the rollout
        n_epochs: int = 4,
        lr: float = 2.5e-4,  # RAdam
        lr_schedule: Decay = "linear",  # constant | linear (to 0 at train.total_steps), CleanRL's anneal_lr
        gamma: float = 0.99,
        q_lambda: float = 0.65,  # Q(lambda): 0 = one-step targets, 1 = Monte Carlo returns
        exploration_fraction: float = 0.5,  # epsilon falls linearly over this fraction of train.total_steps
        exploration_initial_eps: float = 1.0,
        exploration_final_eps: float = 0.05,
        max_grad_norm: float | None = 10.0,
    ) -> None:
        rollout = n_steps * num_envs
        require(n_steps > 0, "algo.n_steps", n_steps, "must be > 0")
        require(0 < num_minibatches <= rollout, "algo.num_minibatches", num_minibatches,
                f"must be in [1, n_steps * num_envs = {rollout}]")
        require(n_epochs > 0, "algo.n_epochs", n_epochs, "must be > 0")
        require(lr > 0, "algo.lr", lr, "must be > 0")
        require(0 <= gamma <= 1, "algo.gamma", gamma, "must be in [0, 1]")
        require(0 <= q_lambda <= 1, "algo.q_lambda", q_lambda, "must be in [0, 1]")
        require(0 <= exploration_fraction <= 1, "algo.exploration_fraction", exploration_fraction, "must be in [0, 1]")
        for key, eps in (("algo.exploration_initial_eps", exploration_initial_eps),
                         ("algo.exploration_final_eps", exploration_final_eps)):
            require(0 <= eps <= 1, key, eps, "must be in [0, 1]")
        require(max_grad_norm is None or max_grad_norm > 0, "algo.max_grad_norm", max_grad_norm, "must be > 0 or null")
        require(not recipe.obs_extractor and not recipe.act_extractor, "actor.obs_extractor",
                recipe.obs_extractor or recipe.act_extractor, "algo=pqn builds one Q-network: use actor.hidden_sizes")
        self.n_actions = int(action_space.n)  # type: ignore[attr-defined]
        self.networks = LayerNormQNetwork(recipe, self.n_actions)
        # RAdam, as CleanRL's PQN: no warm-up of the learning rate needed without a target network
        self.optimizer = RAdam([{"params": self.networks.parameters(), "lr": lr, "base_lr": lr}])
        self.n_steps, self.n_epochs = n_steps, n_epochs
        self.steps_per_collect = n_steps
        self.minibatch_size = rollout // num_minibatches
        self.gamma, self.q_lambda, self.max_grad_norm = gamma, q_lambda, max_grad_norm
        self.epsilon, self.lr_scale = exploration_initial_eps, 1.0
        self.schedulable: tuple[str, ...] = ("lr_scale", "epsilon", "gamma", "q_lambda", "max_grad_norm")
        self.default_schedules: dict[str, Schedule] = {
            "epsilon": Schedule("linear", exploration_initial_eps, exploration_final_eps, exploration_fraction)}
        linear = to_zero(lr_schedule)
        if linear is not None:
            self.default_schedules["lr_scale"] = linear
        self.train_step = LossStep(self.networks, self.optimizer, self.minibatch_loss, clip_of=self)

    @torch.inference_mode()
    def act(self, obs: torch.Tensor, deterministic: bool = False, state: RecurrentState | None = None) -> ActOutput:
        return self.act_on(self.networks(obs), deterministic=deterministic)

    def act_on(self, q: torch.Tensor, values: torch.Tensor | None = None, deterministic: bool = False) -> ActOutput:
        """Epsilon-greedy actions on these Q-values; `values` are the greedy values max_a Q(s, a), what Q(lambda)
        bootstraps from (recomputed here from `q`: a population passes its batched ones, which are the same)."""
        values, actions = q.max(-1)
        if not deterministic:
            actions = epsilon_greedy(actions, self.n_actions, self.epsilon)
        return ActOutput(actions, torch.zeros_like(values), values)

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer]

    def env_actions(self, actions: torch.Tensor) -> torch.Tensor:
        return actions

    def finish_rollout(self, buffer: RolloutStorage, last_obs: torch.Tensor, state: RecurrentState | None) -> None:
        with torch.inference_mode():
            last_values = self.networks(last_obs).max(-1).values
        buffer.returns = q_lambda_returns(buffer.rewards, buffer.values, buffer.terminated, buffer.dones, last_values,
                                          self.gamma, self.q_lambda)
        buffer.advantages = buffer.returns - buffer.values  # not trained on; kept for a uniform rollout

    def update(self, buffer: RolloutStorage, clock: RunClock) -> dict[str, torch.Tensor]:
        return single_rollout_update(self, buffer, clock)

    def _update(self, batch: RolloutBatch, run: Runner) -> dict[str, torch.Tensor]:
        """Epochs of shuffled minibatches, each a gradient step (every epoch's order drawn at once: nothing else
        draws in between); the steps' mean metrics, the acting's epsilon and the learning rate."""
        lr = run.read(self.scheduled_lr)
        size, device = batch_rows(batch), batch.mask.device
        orders = run.draw(lambda: [list(minibatches(size, self.minibatch_size, device)) for _ in range(self.n_epochs)])
        logged: dict[str, list[torch.Tensor]] = {}
        for epoch in orders:
            for idx in epoch:
                _, stats = run(self.train_step, run.take(batch, idx))
                for key, value in stats.items():
                    logged.setdefault(key, []).append(value)
        return {**{k: run.mean(torch.stack(v, -1)) for k, v in logged.items()}, "epsilon": run.read(self.epsilon_now),
                "learning_rate": lr}

    def scheduled_lr(self) -> torch.Tensor:
        """The learning rate, set as the schedule has it now."""
        return torch.tensor(set_lr(self.optimizer, self.lr_scale))

    def epsilon_now(self) -> torch.Tensor:
        return torch.tensor(self.epsilon)

    def minibatch_loss(self, batch: RolloutBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Q(s, a) regressed onto the Q(lambda) returns; (the loss, what to log: it and the mean Q)."""
        q = self.networks(batch.obs).gather(-1, batch.actions.long().unsqueeze(-1)).squeeze(-1)
        loss = masked_mean((q - batch.returns).square(), batch.mask)
        return loss, {"value_loss": loss.detach(), "q_mean": masked_mean(q.detach(), batch.mask)}

    def population_refusal(self) -> str | None:
        return None  # an MLP or CNN Q-network (algo=pqn has no recurrent one)

    def state_dict(self) -> dict[str, Any]:
        return {"networks": self.networks.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.networks.load_state_dict(state["networks"])
        self.optimizer.load_state_dict(state["optimizer"])
