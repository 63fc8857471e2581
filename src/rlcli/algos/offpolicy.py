"""Pieces shared by the off-policy algorithms: the gradient-step runner, the critics' TD loss and the soft
target's next value, target updates, action scaling, exploration noise."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlcli.algos.exploration import uniform_box_actions
from rlcli.algos.loss_step import LossStep
from rlcli.contracts import ReplayStorage, RunClock
from rlcli.registry import ConfigError, require
from rlcli.services.runtime import DeviceConstants

NoiseKind = Literal["gaussian", "ornstein_uhlenbeck", "none"]
TrainFreqUnit = Literal["step", "episode"]
# What an algorithm's step on one batch gives back: each transition's |TD error| for prioritized replay (None for
# stored sequences, which keep no priorities) and the step's metrics (detached scalars).
StepOutput = tuple[torch.Tensor | None, dict[str, torch.Tensor]]


def run_gradient_steps(buffer: ReplayStorage, batch_size: int, steps: int,
                       step: Callable[[Any], StepOutput]) -> dict[str, torch.Tensor]:
    """An off-policy update phase: `steps` times, sample a batch (k of `steps`, for ERE's recency window), let the
    algorithm's `step` take its gradient steps on it, and give the storage the batch's TD errors (a no-op unless
    buffer=per). Returns each metric's mean over the steps that logged it."""
    logs: dict[str, list[torch.Tensor]] = {}
    for k in range(steps):
        batch = buffer.sample(batch_size, k, steps)
        errors, metrics = step(batch)
        if errors is not None:
            buffer.update_priorities(batch.indices, errors)
        for name, value in metrics.items():
            logs.setdefault(name, []).append(value)
    return {name: mean_of_steps(values) for name, values in logs.items()}


def mean_of_steps(values: list[torch.Tensor]) -> torch.Tensor:
    """A metric's mean over an update phase's steps; one step's value as it is (the same number, and two kernels
    fewer per metric: RL-Zoo's SAC and TD3 take one step per env step)."""
    return values[0] if len(values) == 1 else torch.stack(values).mean()


def critics_td_loss(qs: torch.Tensor, target: torch.Tensor, weights: torch.Tensor,
                    scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """An ensemble of critics' squared TD error toward one target (qs [N, B], target [B]): `scale` x the sum over
    critics of the importance-weighted batch mean (SAC and CrossQ: 0.5, TD3: 1), and each transition's |TD error|
    averaged over the critics (PER's priorities)."""
    td = qs - target
    return scale * (weights * td.square()).mean(-1).sum(), td.detach().abs().mean(0)


def soft_next_value(next_qs: torch.Tensor, next_log_probs: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """The soft value of the next state: the smallest critic's Q at a next action drawn from the policy, minus
    alpha x its log-probability (SAC's clipped double-Q; CrossQ's)."""
    return next_qs.min(0).values - alpha * next_log_probs


@torch.no_grad()
def polyak_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """target <- (1 - tau) target + tau source, in one fused call over all tensors."""
    t_params, s_params = list(target.parameters()), list(source.parameters())
    if tau >= 1.0:
        torch._foreach_copy_(t_params, s_params)
    else:
        torch._foreach_lerp_(t_params, s_params, tau)


class BoxScaler:
    """Algorithms act in [-1, 1]; the env gets actions rescaled to its bounds (in torch, so that an
    exported policy folds the same arithmetic in)."""

    def __init__(self, space: gym.spaces.Box):
        if not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
            raise ConfigError("off-policy continuous algorithms need finite action bounds; this env's are infinite")
        self.bounds = DeviceConstants(space.low.astype(np.float32), space.high.astype(np.float32))

    def to_env(self, actions: torch.Tensor) -> torch.Tensor:
        low, high = self.bounds.on(actions.device)
        return low + (actions.detach().clamp(-1.0, 1.0) + 1.0) * 0.5 * (high - low)


class BoxActorCritic:
    """What SAC, TD3 and CrossQ share around their losses: uniform warm-up actions in the unit box, their two
    optimizers (policy and critics; SAC's temperature has its own, checkpointed with it), and the unit box
    scaled to the env's bounds."""

    action_dim: int
    networks: nn.Module
    policy_optimizer: torch.optim.Optimizer
    critic_optimizer: torch.optim.Optimizer
    max_grad_norm: float | None
    scaler: BoxScaler

    def random_actions(self, n: int) -> torch.Tensor:
        return uniform_box_actions(n, self.action_dim)

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.policy_optimizer, self.critic_optimizer]

    def build_steps(self, critic_loss: Callable[..., Any], policy_loss: Callable[..., Any],
                    updates_buffers: bool = False) -> None:
        """The critics' step and the policy's step (`critic_train_step`, `policy_train_step`): one LossStep each,
        over all the networks (each differentiates its optimizer's parameters only)."""
        net = self.networks
        self.critic_train_step = LossStep(net, self.critic_optimizer, critic_loss, self, updates_buffers)
        self.policy_train_step = LossStep(net, self.policy_optimizer, policy_loss, self, updates_buffers)

    def env_actions(self, actions: torch.Tensor) -> torch.Tensor:
        return self.scaler.to_env(actions)


class ExplorationNoise:
    """Gaussian or Ornstein-Uhlenbeck noise per env, scaled by `std` times a factor (TD3's `noise_scale`)."""

    def __init__(self, kind: NoiseKind, std: float, num_envs: int, action_dim: int, theta: float = 0.15,
                 dt: float = 1e-2):
        require(std >= 0, "algo.noise_std", std, "must be >= 0")
        self.kind, self.std, self.theta, self.dt = kind, std, theta, dt
        self.state = torch.zeros(num_envs, action_dim)

    def sample(self, shape: torch.Size, factor: float = 1.0) -> torch.Tensor:
        scale = self.std * factor
        if self.kind == "none" or scale == 0.0:
            return torch.zeros(shape)
        if self.kind == "gaussian":
            return scale * torch.randn(shape)
        self.state += self.theta * -self.state * self.dt + scale * np.sqrt(self.dt) * torch.randn(self.state.shape)
        return self.state.clone()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"state": self.state.clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.state.copy_(state["state"])


def check_offpolicy(lr: float, batch_size: int, learning_starts: int, train_freq: int, gradient_steps: int,
                    gamma: float, tau: float, reward_scale: float) -> None:
    require(lr > 0, "algo.lr", lr, "must be > 0")
    require(batch_size > 0, "algo.batch_size", batch_size, "must be > 0")
    require(learning_starts >= 0, "algo.learning_starts", learning_starts, "must be >= 0")
    require(train_freq > 0, "algo.train_freq", train_freq, "must be > 0")
    require(gradient_steps >= -1, "algo.gradient_steps", gradient_steps,
            "must be >= 0, or -1 (as SB3: one gradient step per env step collected)")
    require(0 <= gamma <= 1, "algo.gamma", gamma, "must be in [0, 1]")
    require(0 < tau <= 1, "algo.tau", tau, "must be in (0, 1]")
    require(reward_scale > 0, "algo.reward_scale", reward_scale, "must be > 0")


def collect_phase(train_freq: int, unit: TrainFreqUnit) -> tuple[int, int]:
    """The contract's (steps_per_collect, episodes_per_collect) for SB3's `train_freq` and its unit. "step": a
    collect phase is `train_freq` steps of each env; "episode": it lasts until `train_freq` episodes have ended,
    counted over all envs (SB3's train_freq=(n, "episode"), which RL-Zoo's DDPG entries use), so it has no fixed
    length and steps_per_collect is 1 (the collector ends the phase)."""
    require(unit in ("step", "episode"), "algo.train_freq_unit", unit, "choose from: step, episode")
    return (train_freq, 0) if unit == "step" else (1, train_freq)


def resolve_gradient_steps(gradient_steps: int, train_freq: int, num_envs: int, unit: TrainFreqUnit = "step") -> int:
    """SB3's gradient_steps=-1: as many gradient steps as env steps each collect phase gathers (train_freq
    steps of each env). Batches are drawn with replacement, so an early update (learning_starts below
    batch_size, as in RL-Zoo's learning_starts=0) samples what the buffer holds, as SB3 does. An episodic
    phase's length is known only once collected: -1 stays, and `gradient_steps_now` reads the clock."""
    if gradient_steps != -1 or unit == "episode":
        return gradient_steps
    return train_freq * num_envs


def gradient_steps_now(gradient_steps: int, clock: RunClock) -> int:
    """This update phase's gradient steps: the resolved setting, or (-1) one per transition just collected."""
    return clock.transitions if gradient_steps == -1 else gradient_steps
