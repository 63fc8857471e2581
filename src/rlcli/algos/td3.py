"""TD3 (Fujimoto et al. 2018) and DDPG (Lillicrap et al. 2016) for Box actions.

TD3 = DDPG + twin critics (the minimum is the target) + target policy smoothing + delayed policy
updates. DDPG here is TD3 with one critic, no smoothing and no delay.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlcli.actors.offpolicy import Critics, DeterministicPolicy, NetworkRecipe
from rlcli.algos.base import adam
from rlcli.algos.offpolicy import (
    BoxActorCritic,
    BoxScaler,
    ExplorationNoise,
    NoiseKind,
    StepOutput,
    TrainFreqUnit,
    check_offpolicy,
    collect_phase,
    critics_td_loss,
    resolve_gradient_steps,
)
from rlcli.algos.runner import Runner, batch_rows, single_run_update
from rlcli.contracts import ActOutput, AlgoSpec, RecurrentState, ReplayStorage, RunClock, SequenceStorage
from rlcli.registry import ALGOS, require
from rlcli.schedules import to_zero

# no recurrent critics for TD3/DDPG yet
SPEC = AlgoSpec(on_policy=False, action_spaces=("Box",), networks=("mlp", "cnn"), compiles=True,
                population="lockstep")


class TD3Networks(nn.Module):
    def __init__(self, torso: NetworkRecipe, action_dim: int, num_critics: int):
        super().__init__()
        self.normalizer = torso.normalizer
        self.policy = DeterministicPolicy(torso, action_dim)
        self.critics = Critics(torso, action_dim, num_critics)
        self.policy_target = copy.deepcopy(self.policy).requires_grad_(False)
        self.critics_target = copy.deepcopy(self.critics).requires_grad_(False)


@ALGOS.register("td3", spec=SPEC)
class TD3(BoxActorCritic):
    def __init__(
        self,
        recipe: NetworkRecipe,
        action_space: gym.spaces.Space,
        num_envs: int,
        lr: float = 1e-3,
        batch_size: int = 256,
        learning_starts: int = 10_000,
        train_freq: int = 1,  # env steps per env between update phases (offline: loop steps, one gradient step each)
        train_freq_unit: TrainFreqUnit = "step",  # step | episode (a collect phase lasts until train_freq episodes end,
                                                  # SB3's (n, "episode"); only an online run collects episodes)
        gradient_steps: int = 1,  # gradient steps per update phase
        gamma: float = 0.99,  # discount
        tau: float = 0.005,  # Polyak rate of the target networks
        num_critics: int = 2,  # the target takes the smallest; the policy climbs the first (rebrac's: the smallest)
        policy_delay: int = 2,  # critic updates per policy (and target) update
        target_policy_noise: float = 0.2,  # target policy smoothing's std, in the [-1, 1] action scale
        target_noise_clip: float = 0.5,  # ... clipped to this
        noise: NoiseKind = "gaussian",  # gaussian | ornstein_uhlenbeck | none: exploration (offline: only if it acts in
                                        # an env online)
        noise_std: float = 0.1,  # in the [-1, 1] action scale
        noise_decay: Literal["constant", "linear"] = "constant",  # constant | linear (to 0 at train.total_steps, the
                                                                  # run's end)
        reward_scale: float = 1.0,  # rewards are multiplied by this in the target
        max_grad_norm: float | None = None,  # clip each step's gradient global norm (null: no clip)
    ) -> None:
        check_offpolicy(lr, batch_size, learning_starts, train_freq, gradient_steps, gamma, tau, reward_scale)
        require(num_critics >= 1, "algo.num_critics", num_critics, "must be >= 1")
        require(policy_delay >= 1, "algo.policy_delay", policy_delay, "must be >= 1")
        require(target_policy_noise >= 0, "algo.target_policy_noise", target_policy_noise, "must be >= 0")
        require(target_noise_clip >= 0, "algo.target_noise_clip", target_noise_clip, "must be >= 0")
        self.scaler = BoxScaler(action_space)
        self.action_dim = int(np.prod(action_space.shape))
        self.networks = self.make_networks(recipe, num_critics)
        self.policy_optimizer = adam(self.networks.policy.parameters(), lr=lr)
        self.critic_optimizer = adam(self.networks.critics.parameters(), lr=lr)
        self.noise = ExplorationNoise(noise, noise_std, num_envs, self.action_dim)
        self.noise_scale = 1.0  # noise_decay=linear: a factor from 1 to 0, set by the trainer's schedules
        linear = to_zero(noise_decay)
        self.default_schedules = {"noise_scale": linear} if linear else {}
        self.steps_per_collect, self.episodes_per_collect = collect_phase(train_freq, train_freq_unit)
        self.batch_size, self.learning_starts = batch_size, learning_starts
        self.gradient_steps = resolve_gradient_steps(gradient_steps, train_freq, num_envs, train_freq_unit)
        self.gamma, self.tau, self.policy_delay = gamma, tau, policy_delay
        self.target_policy_noise, self.target_noise_clip = target_policy_noise, target_noise_clip
        self.reward_scale, self.max_grad_norm = reward_scale, max_grad_norm
        self.gradient_updates = 0
        self.schedulable: tuple[str, ...] = ("gamma", "tau", "noise_scale", "target_policy_noise",
                                             "target_noise_clip", "reward_scale", "max_grad_norm")
        # the critics' and the policy's steps (compile=true: one graph each; the target updates stay eager: a lerp)
        self.build_steps(self.critic_loss, self._policy_loss_and_nothing)

    def make_networks(self, recipe: NetworkRecipe, num_critics: int) -> Any:
        """The policy, critics and their targets (MADDPG: a team's, algos/centralized_critic.py)."""
        return TD3Networks(recipe, self.action_dim, num_critics)

    def _policy_loss_and_nothing(self, obs: torch.Tensor) -> tuple[torch.Tensor, tuple[()]]:
        return self.actor_loss(obs), ()

    @torch.inference_mode()
    def act(self, obs: torch.Tensor, deterministic: bool = False, state: RecurrentState | None = None) -> ActOutput:
        """The policy's actions, with the exploration noise unless deterministic."""
        actions = self.networks.policy(obs)
        if not deterministic:
            actions = explored(actions, self.noise.sample(actions.shape, self.noise_scale))
        zeros = torch.zeros(actions.shape[0], device=actions.device)
        return ActOutput(actions, zeros, zeros)

    def update(self, buffer: ReplayStorage | SequenceStorage, clock: RunClock) -> dict[str, torch.Tensor]:
        return single_run_update(self, buffer, clock)

    def critic_inputs(self, batch: Any, storage: Any) -> tuple[torch.Tensor, ...]:
        """What the critics' loss takes after the batch and the smoothing's draws (ReBRAC: the data's next actions)."""
        return ()

    def policy_inputs(self, batch: Any) -> tuple[torch.Tensor, ...]:
        """What the policy's loss takes (TD3+BC: the dataset's actions too)."""
        return (batch.obs,)

    def policy_metrics(self, aux: Any) -> dict[str, torch.Tensor]:
        """The policy loss's own metrics, from what it returned beside the loss (TD3+BC: its BC term)."""
        return {}

    def _gradient_step(self, batch: Any, run: Runner) -> StepOutput:
        """The critics' step on one batch; every policy_delay-th one, the policy's and the target updates too;
        written for a runner (algos/runner.py)."""
        net = self.networks
        shape, device = (batch_rows(batch), self.action_dim), batch.rewards.device
        # the smoothing's draws, from the run's stream (where the loss would draw them: nothing in between draws)
        noise = run.draw(lambda: torch.randn(shape, device=device)) if self.target_policy_noise > 0 else None
        critic_loss, (errors, q_mean) = run(self.critic_train_step, batch, noise,
                                            *self.critic_inputs(batch, run.storage))
        self.gradient_updates += 1
        metrics = {"value_loss": critic_loss.detach(), "q_mean": q_mean}
        if self.gradient_updates % self.policy_delay == 0:
            # through the critics just stepped
            policy_loss, aux = run(self.policy_train_step, *self.policy_inputs(batch))
            run.polyak(net.critics_target, net.critics)
            run.polyak(net.policy_target, net.policy)
            metrics |= {"policy_loss": policy_loss.detach(), **self.policy_metrics(aux)}
        return errors, metrics

    def critic_loss(self, batch: Any, noise: torch.Tensor | None = None,
                    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The critics' TD loss toward the smallest target critic at the smoothed target action, with each
        transition's |TD error| (PER priorities) and the mean Q. `noise`: the smoothing's standard-normal draws,
        when the caller drew them (a population, from each member's own stream)."""
        net = self.networks
        with torch.no_grad():
            next_actions = net.policy_target(batch.next_obs)
            if self.target_policy_noise > 0:  # target policy smoothing
                drawn = torch.randn_like(next_actions) if noise is None else noise
                smoothing = (drawn * self.target_policy_noise).clamp(-self.target_noise_clip, self.target_noise_clip)
                next_actions = (next_actions + smoothing).clamp(-1.0, 1.0)
            next_q = net.critics_target(batch.next_obs, next_actions).min(0).values
            target = self.reward_scale * batch.rewards + batch.discounts * next_q
        qs = net.critics(batch.obs, batch.actions)
        loss, priorities = critics_td_loss(qs, target, batch.weights)
        return loss, (priorities, qs.detach().mean())

    def actor_loss(self, obs: torch.Tensor) -> torch.Tensor:
        """The deterministic policy gradient's loss: minus the first critic's Q at the policy's action."""
        net = self.networks
        return -net.critics.nets[0](obs, net.policy(obs)).mean()

    def state_dict(self) -> dict[str, Any]:
        return {"networks": self.networks.state_dict(), "policy_optimizer": self.policy_optimizer.state_dict(),
                "critic_optimizer": self.critic_optimizer.state_dict(), "noise": self.noise.state_dict(),
                "gradient_updates": self.gradient_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.networks.load_state_dict(state["networks"])
        self.policy_optimizer.load_state_dict(state["policy_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.noise.load_state_dict(state["noise"])
        self.gradient_updates = state["gradient_updates"]


@ALGOS.register("ddpg", spec=SPEC)
class DDPG(TD3):
    """DDPG (Lillicrap et al. 2016) is TD3's machinery with DDPG's choices: one critic, no target policy smoothing,
    no policy delay."""

    def __init__(
        self,
        recipe: NetworkRecipe,
        action_space: gym.spaces.Space,
        num_envs: int,
        num_critics: int = 1,  # DDPG = TD3 with one critic, no target smoothing and no policy delay
        policy_delay: int = 1,
        target_policy_noise: float = 0.0,
        target_noise_clip: float = 0.0,
        **td3_settings: Any,
    ) -> None:
        super().__init__(recipe, action_space, num_envs, num_critics=num_critics, policy_delay=policy_delay,
                         target_policy_noise=target_policy_noise, target_noise_clip=target_noise_clip, **td3_settings)


def explored(actions: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """The policy's actions with exploration noise (drawn on the CPU), kept in [-1, 1]."""
    return (actions + noise.to(actions.device)).clamp(-1.0, 1.0)
