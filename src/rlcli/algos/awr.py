"""Advantage-weighted regression, the actor update IQL and AWAC share: the policy maximizes the dataset actions'
log-likelihood, each weighted by exp(beta * advantage), so it only ever imitates actions the data holds (no query
of the critics at actions the data lacks, the offline failure mode) and leans toward the better ones.

The actor is CORL's Gaussian policy with a state-independent log std (its mean tanh-squashed for IQL, plain for
AWAC): the log-likelihood of a dataset action at the unit box's edge stays finite, which a tanh-squashed sample's
change of variables (SAC's policy) does not.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlcli.actors.offpolicy import LOG_STD_MAX, LOG_STD_MIN, DeterministicPolicy, NetworkRecipe
from rlcli.algos.offpolicy import (
    BoxActorCritic,
    BoxScaler,
    StepOutput,
    check_offpolicy,
    collect_phase,
    resolve_gradient_steps,
)
from rlcli.algos.runner import Runner, single_run_update
from rlcli.batches import ReplayBatch
from rlcli.contracts import ActOutput, RecurrentState, ReplayStorage, RunClock
from rlcli.registry import require
from rlcli.schedules import Schedule

EXP_ADV_MAX = 100.0  # CORL's clip of exp(beta * advantage): a few large advantages must not take the whole batch


def advantage_weights(advantages: torch.Tensor, beta: float, clip: float = EXP_ADV_MAX) -> torch.Tensor:
    """exp(beta * A), clipped above at `clip` (IQL: beta = its inverse temperature; AWAC: 1 / lambda)."""
    return torch.exp(beta * advantages).clamp(max=clip)


class GaussianActor(nn.Module):
    """N(mean(s), exp(log_std)) with one learned log std per action dimension; samples clamped to [-1, 1]."""

    def __init__(self, torso: NetworkRecipe, action_dim: int, tanh_mean: bool):
        super().__init__()
        self.net = torso.make(action_dim, out_gain=0.01)
        self.log_std = nn.Parameter(torch.zeros(action_dim))
        self.tanh_mean = tanh_mean

    def mean_std(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = self.net(obs)
        return (torch.tanh(mean) if self.tanh_mean else mean), self.log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp()

    def log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """[B] log-likelihood of `actions` (summed over action dimensions)."""
        mean, std = self.mean_std(obs)
        return normal_log_prob(actions, mean, std)

    def forward(self, obs: torch.Tensor, deterministic: bool = False,
                noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Actions in [-1, 1] (the mean, or a sample; `noise`: its standard-normal draws when the caller drew them)
        and their log-probabilities (of the clamped action, as CORL's AWAC)."""
        mean, std = self.mean_std(obs)
        if deterministic:
            return mean.clamp(-1.0, 1.0), torch.zeros(mean.shape[:-1], device=mean.device)
        if noise is None:
            noise = torch.randn_like(mean)
        actions = (mean + std * noise).clamp(-1.0, 1.0)
        return actions, normal_log_prob(actions, mean, std)


def normal_log_prob(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Sum over the last axis of a diagonal Gaussian's log-density."""
    return (-0.5 * ((x - mean) / std).square() - std.log() - 0.5 * math.log(2 * math.pi)).sum(-1)


def act_with(policy: GaussianActor | DeterministicPolicy, obs: torch.Tensor, deterministic: bool) -> ActOutput:
    """What `act` returns for an advantage-weighted actor (a deterministic one's log-probs are zeros)."""
    if isinstance(policy, DeterministicPolicy):
        actions = policy(obs)
        log_probs = torch.zeros(actions.shape[:-1], device=actions.device)
    else:
        actions, log_probs = policy(obs, deterministic)
    return ActOutput(actions, log_probs, torch.zeros_like(log_probs))


def awr_policy_loss(policy: GaussianActor | DeterministicPolicy, obs: torch.Tensor, actions: torch.Tensor,
                    weights: torch.Tensor) -> torch.Tensor:
    """mean(-w * log pi(a|s)); a deterministic policy's is mean(w * |pi(s) - a|^2) (CORL's iql_deterministic)."""
    if isinstance(policy, DeterministicPolicy):
        return (weights * (policy(obs) - actions).square().sum(-1)).mean()
    return -(weights * policy.log_prob(obs, actions)).mean()


class AdvantageWeightedActorCritic(BoxActorCritic):
    """What IQL and AWAC share around their losses: the off-policy settings every offline algorithm keeps (so the
    loop's off-policy machinery runs it unchanged), acting, the update phase and the checkpoint state. Each sets
    `networks` (with `policy`), its optimizers and its `_gradient_step`."""

    def setup(self, action_space: gym.spaces.Space, num_envs: int, lr: float, batch_size: int, learning_starts: int,
              train_freq: int, gradient_steps: int, gamma: float, tau: float, reward_scale: float,
              max_grad_norm: float | None) -> None:
        check_offpolicy(lr, batch_size, learning_starts, train_freq, gradient_steps, gamma, tau, reward_scale)
        require(max_grad_norm is None or max_grad_norm > 0, "algo.max_grad_norm", max_grad_norm, "must be > 0 or null")
        self.scaler = BoxScaler(action_space)
        self.action_dim = int(np.prod(action_space.shape))
        self.steps_per_collect, self.episodes_per_collect = collect_phase(train_freq, "step")
        self.batch_size, self.learning_starts = batch_size, learning_starts
        self.gradient_steps = resolve_gradient_steps(gradient_steps, train_freq, num_envs)
        self.gamma, self.tau, self.reward_scale, self.max_grad_norm = gamma, tau, reward_scale, max_grad_norm
        self.gradient_updates = 0
        self.default_schedules: dict[str, Schedule] = {}
        self.schedulable: tuple[str, ...] = ("gamma", "tau", "reward_scale", "max_grad_norm")

    @torch.inference_mode()
    def act(self, obs: torch.Tensor, deterministic: bool = False, state: RecurrentState | None = None) -> ActOutput:
        return act_with(self.networks.policy, obs, deterministic)

    def update(self, buffer: ReplayStorage, clock: RunClock) -> dict[str, torch.Tensor]:
        return single_run_update(self, buffer, clock)

    def _gradient_step(self, batch: ReplayBatch, run: Runner) -> StepOutput:
        """One gradient step, written for a runner (algos/runner.py)."""
        raise NotImplementedError

    def named_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"policy_optimizer": self.policy_optimizer, "critic_optimizer": self.critic_optimizer}

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return list(self.named_optimizers().values())

    def state_dict(self) -> dict[str, Any]:
        return {"networks": self.networks.state_dict(), "gradient_updates": self.gradient_updates,
                **{name: optimizer.state_dict() for name, optimizer in self.named_optimizers().items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.networks.load_state_dict(state["networks"])
        for name, optimizer in self.named_optimizers().items():
            optimizer.load_state_dict(state[name])
        self.gradient_updates = state["gradient_updates"]
