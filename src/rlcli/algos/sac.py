"""Soft Actor-Critic (Haarnoja et al. 2018) with N critics and automatic entropy tuning."""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlcli.actors.offpolicy import (
    Critics,
    NetworkRecipe,
    SquashedGaussianPolicy,
    sde_squashed_policy,
    squashed_gaussian,
)
from rlcli.actors.recurrent import RecurrentCritics, RecurrentNet, RecurrentRecipe, state_or_zeros
from rlcli.actors.sde import NoiseResampling, StateDependentSquashedPolicy
from rlcli.algos.base import adam, masked_mean
from rlcli.algos.entropy import (
    EntropyCoefficient,
    FixedEntropyCoefficient,
    check_entropy_settings,
    initial_log_alpha,
    learned_temperature_step,
)
from rlcli.algos.offpolicy import (
    BoxActorCritic,
    BoxScaler,
    StepOutput,
    TrainFreqUnit,
    check_offpolicy,
    collect_phase,
    critics_td_loss,
    resolve_gradient_steps,
    soft_next_value,
)
from rlcli.algos.runner import Runner, batch_rows, single_run_update
from rlcli.batches import SequenceBatch
from rlcli.contracts import ActOutput, AlgoSpec, RecurrentState, ReplayStorage, RunClock, SequenceStorage
from rlcli.registry import ALGOS, require
from rlcli.schedules import Schedule


class SACNetworks(nn.Module):
    def __init__(self, torso: NetworkRecipe, action_dim: int, num_critics: int, log_alpha: float,
                 critic_outputs: int = 1, use_sde: bool = False):
        super().__init__()
        self.normalizer = torso.normalizer
        self.policy: SquashedGaussianPolicy | StateDependentSquashedPolicy = (
            sde_squashed_policy(torso, action_dim) if use_sde else SquashedGaussianPolicy(torso, action_dim))
        self.critics = Critics(torso, action_dim, num_critics, critic_outputs)
        self.critics_target = copy.deepcopy(self.critics).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(float(log_alpha)))


class RecurrentSACNetworks(nn.Module):
    """Recurrent SAC: a recurrent policy stepped with the acting carry (stored with each sequence) and
    recurrent critics unrolled from zero over each sequence; see RecurrentCritics."""

    def __init__(self, torso: RecurrentRecipe, action_dim: int, num_critics: int, log_alpha: float):
        super().__init__()
        self.normalizer = torso.normalizer
        self.carry_size = torso.carry_size
        self.policy = RecurrentNet(torso, 2 * action_dim, out_gain=0.01)
        self.critics = RecurrentCritics(torso, action_dim, num_critics)
        self.critics_target = copy.deepcopy(self.critics).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(float(log_alpha)))

    def initial_carry(self, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.zeros(n, self.carry_size, device=device)

    def act(self, obs: torch.Tensor, deterministic: bool,
            state: RecurrentState | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        params, carry = self.policy.step(obs, *state_or_zeros(state, obs, self.carry_size))
        return (*squashed_gaussian(params, deterministic), carry)


@ALGOS.register("sac", spec=AlgoSpec(on_policy=False, action_spaces=("Box",), compiles=True,
                                     population="lockstep"))
class SAC(BoxActorCritic):
    ent_coef = FixedEntropyCoefficient()  # algo.schedules.ent_coef, with a fixed algo.ent_coef

    def __init__(
        self,
        recipe: NetworkRecipe | RecurrentRecipe,
        action_space: gym.spaces.Space,
        num_envs: int,
        lr: float = 3e-4,
        batch_size: int = 256,
        learning_starts: int = 1000,
        train_freq: int = 1,
        train_freq_unit: TrainFreqUnit = "step",  # step | episode (a collect phase lasts until train_freq episodes end,
                                                  # SB3's (n, "episode"))
        gradient_steps: int = 1,
        gamma: float = 0.99,
        tau: float = 0.005,  # target critics' Polyak weight
        num_critics: int = 2,  # TQC: sb3-contrib's default; its paper uses 5 on MuJoCo
        ent_coef: float | str = "auto",  # the entropy temperature: auto (tuned toward target_entropy) or a fixed number
        ent_coef_init: float = 1.0,
        target_entropy: float | str = "auto",  # auto = -(action dimensions)
        target_update_interval: int = 1,
        reward_scale: float = 1.0,  # rewards are multiplied by it in the targets
        max_grad_norm: float | None = None,  # global grad-norm clip of each step (null: none)
        use_sde: bool = False,  # gSDE (Raffin et al. 2021): state-dependent exploration noise
        sde_sample_freq: int = -1,  # gSDE: new noise matrices every n steps (-1: once per collect phase)
    ) -> None:
        check_offpolicy(lr, batch_size, learning_starts, train_freq, gradient_steps, gamma, tau, reward_scale)
        require(num_critics >= 1, "algo.num_critics", num_critics, "must be >= 1")
        require(not (use_sde and isinstance(recipe, RecurrentRecipe)), "algo.use_sde", use_sde,
                "gSDE needs actor=mlp or cnn (not a recurrent actor)")
        check_entropy_settings(ent_coef, ent_coef_init, target_entropy)
        require(target_update_interval > 0, "algo.target_update_interval", target_update_interval, "must be > 0")
        self.scaler = BoxScaler(action_space)
        self.action_dim = int(np.prod(action_space.shape))
        log_alpha = initial_log_alpha(ent_coef, ent_coef_init)
        self.recurrent = isinstance(recipe, RecurrentRecipe)
        self.networks = self.make_networks(recipe, num_critics, log_alpha, use_sde)
        policy = self.networks.policy
        # gSDE: new exploration matrices at each collect phase's start (and every sde_sample_freq steps)
        require(not (use_sde and train_freq_unit == "episode"), "algo.train_freq_unit", train_freq_unit,
                "with algo.use_sde=true must be step: gSDE redraws its noise at fixed-length collect phases")
        self.noise_resampling = NoiseResampling(
            policy.noise if isinstance(policy, StateDependentSquashedPolicy) else None, train_freq, sde_sample_freq)
        self.policy_optimizer = adam(self.networks.policy.parameters(), lr=lr)
        self.critic_optimizer = adam(self.networks.critics.parameters(), lr=lr)
        self.temperature = EntropyCoefficient(self.networks.log_alpha, ent_coef, target_entropy, self.action_dim, lr)
        self.steps_per_collect, self.episodes_per_collect = collect_phase(train_freq, train_freq_unit)
        self.batch_size, self.learning_starts = batch_size, learning_starts
        self.gradient_steps = resolve_gradient_steps(gradient_steps, train_freq, num_envs, train_freq_unit)
        self.gamma, self.tau, self.target_update_interval = gamma, tau, target_update_interval
        self.reward_scale, self.max_grad_norm = reward_scale, max_grad_norm
        self.gradient_updates = 0
        self.default_schedules: dict[str, Schedule] = {}
        self.schedulable: tuple[str, ...] = ("gamma", "tau", "reward_scale", "max_grad_norm",
                                             *self.temperature.schedulable)
        # what a population's members may differ in beside seed, lr, tau and max_grad_norm: their step reads these
        # per member (sweeps/population/lockstep.py)
        self.member_settings = {"temperature.learned": "ent_coef", "temperature.fixed": "ent_coef",
                                "temperature.target_entropy": "target_entropy",
                                "target_update_interval": "target_update_interval"}
        # the critics', the policy's and the temperature's steps (compile=true: one graph each; the target update
        # stays eager: a lerp). gSDE's exploration matrix, drawn for each gradient step, is an argument like the
        # Gaussian's noise.
        self.build_steps(*((self.sequence_td_loss, self.sequence_actor_loss) if self.recurrent
                           else (self.soft_td_loss, self.actor_loss)))
        self.temperature_train_step = self.temperature.train_step(self.networks, self)

    def make_networks(self, recipe: NetworkRecipe | RecurrentRecipe, num_critics: int, log_alpha: float,
                      use_sde: bool) -> Any:
        """The policy, critics, target critics and temperature (MASAC: a team's, algos/centralized_critic.py)."""
        if isinstance(recipe, RecurrentRecipe):
            return RecurrentSACNetworks(recipe, self.action_dim, num_critics, log_alpha)
        return SACNetworks(recipe, self.action_dim, num_critics, log_alpha, self.critic_outputs(), use_sde)

    def critic_outputs(self) -> int:
        """Outputs of each critic: one Q-value (TQC: its quantiles)."""
        return 1

    def alpha(self) -> torch.Tensor:
        return self.temperature.value()

    @torch.inference_mode()
    def act(self, obs: torch.Tensor, deterministic: bool = False, state: RecurrentState | None = None) -> ActOutput:
        self.noise_resampling.before_act(obs.shape[0], deterministic)
        carry = None
        if isinstance(self.networks, RecurrentSACNetworks):
            actions, log_probs, carry = self.networks.act(obs, deterministic, state)
        else:
            actions, log_probs = self.networks.policy(obs, deterministic)
        return ActOutput(actions, log_probs, torch.zeros_like(log_probs), carry)

    def population_refusal(self) -> str | None:
        """What keeps this member out of a batched population (sweeps/population/lockstep.py), or None."""
        return "a recurrent actor (actor=gru/lstm)" if self.recurrent else None

    def update(self, buffer: ReplayStorage | SequenceStorage, clock: RunClock) -> dict[str, torch.Tensor]:
        return single_run_update(self, buffer, clock)

    def _gradient_step(self, batch: Any, run: Runner) -> StepOutput:
        """The critics' step, then the policy's (through the critics just stepped), the temperature's and the target
        update, on one batch (of transitions, or of stored sequences for a recurrent actor); written for a runner
        (algos/runner.py)."""
        net = self.networks
        alpha = run.read(self.alpha)
        if self.recurrent:  # one draw for every position after the burn-in, next actions' and actions' alike
            shape = (batch.obs.shape[0] - batch.burn_in, batch_rows(batch), self.action_dim)
            noise = run.draw(lambda: torch.randn(shape, device=batch.rewards.device))
            (critic_loss, _), errors = run(self.critic_train_step, batch, alpha, noise), None  # no priorities
            policy_loss, (log_probs, valid) = run(self.policy_train_step, batch, alpha, noise)
        else:
            valid = None
            rows, device = batch_rows(batch), batch.rewards.device
            # the policy's draws (next actions', then actions'; gSDE: one exploration matrix) from the run's stream
            next_noise, noise = run.draw(lambda: net.policy.gradient_step_draws(rows, device))
            critic_loss, errors = run(self.critic_train_step, batch, alpha, next_noise)
            policy_loss, log_probs = run(self.policy_train_step, batch.obs, alpha, noise)
        log_probs = self.entropy_log_probs(run, log_probs, batch.obs)
        self.temperature_and_targets(run, log_probs, valid)
        entropy = -run.mean(log_probs) if valid is None else -masked_mean(log_probs, valid)
        return errors, {"value_loss": critic_loss.detach(), "policy_loss": policy_loss.detach(), "alpha": alpha,
                        "entropy": entropy}

    def entropy_log_probs(self, run: Runner, log_probs: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """The policy's log-probs as the temperature's step and the logged entropy read them (MASAC counts an agent
        that has left at its share of the target)."""
        return log_probs

    def temperature_and_targets(self, run: Runner, log_probs: torch.Tensor, valid: torch.Tensor | None = None) -> None:
        """After the policy's step: the temperature's step where it learns (`valid`: a sequence's real steps), then
        the target critics' update where it is due (each member of a population by its own settings)."""
        learned_temperature_step(run, self, log_probs, valid)
        self.gradient_updates += 1
        updates = self.gradient_updates
        if (due := run.only(lambda algo: updates % algo.target_update_interval == 0)) is not None:
            due.polyak(self.networks.critics_target, self.networks.critics)

    def soft_td_loss(self, batch: Any, alpha: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The critics' loss on a batch, next actions drawn from the current policy with `noise` (its
        standard-normal draws; gSDE: the step's exploration matrix)."""
        with torch.no_grad():
            next_actions, next_log_probs = self.networks.policy(batch.next_obs, noise=noise)
        return self.critic_loss(batch, next_actions, next_log_probs, alpha)

    def actor_loss(self, obs: torch.Tensor, alpha: torch.Tensor,
                   noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The policy's loss alpha * log pi - Q (after the critics' step), and its log-probs (detached) for the
        temperature's step."""
        actions, log_probs = self.networks.policy(obs, noise=noise)
        return (alpha * log_probs - self.policy_q(obs, actions)).mean(), log_probs.detach()

    def critic_loss(self, batch: Any, next_actions: torch.Tensor, next_log_probs: torch.Tensor,
                    alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Clipped double-Q soft TD loss over all critics, and each transition's |TD error| (PER priorities)."""
        net = self.networks
        with torch.no_grad():
            next_q = soft_next_value(net.critics_target(batch.next_obs, next_actions), next_log_probs, alpha)
            target = self.reward_scale * batch.rewards + batch.discounts * next_q
        return critics_td_loss(net.critics(batch.obs, batch.actions), target, batch.weights, scale=0.5)

    def policy_q(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """The value the policy climbs: the smallest critic's Q."""
        return self.networks.critics(obs, actions).min(0).values

    def sequence_td_loss(self, batch: SequenceBatch, alpha: torch.Tensor,
                         noise: torch.Tensor) -> tuple[torch.Tensor, tuple[()]]:
        """The critics' loss on stored sequences: the policy's carry refreshed over the burn-in, the critics unrolled
        from zero, the soft TD loss over the steps after it, masked to real transitions (no TD errors: stored
        sequences keep no priorities)."""
        burn = batch.burn_in
        net, obs, starts, valid = self.networks, batch.obs, batch.starts, batch.valid[burn:]
        with torch.no_grad():
            actions, log_probs = squashed_gaussian(self.sequence_policy(batch), noise=noise)
            target_features = [h[burn + 1:] for h in net.critics_target.features(obs, starts, 0)]
            next_q = soft_next_value(net.critics_target.q(target_features, actions[1:]), log_probs[1:], alpha)
            target = self.reward_scale * batch.rewards[burn:] + self.gamma * (1.0 - batch.terminated[burn:]) * next_q
        features = net.critics.features(obs, starts, burn)
        qs = net.critics.q([h[:-1] for h in features], batch.actions[burn:])  # [N, L - burn, B]
        return 0.5 * masked_mean((qs - target).square().sum(0), valid), ()

    def sequence_actor_loss(self, batch: SequenceBatch, alpha: torch.Tensor,
                            noise: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The policy's loss on stored sequences (through the critics' features, without their gradients), and the
        log-probs with the mask of real transitions for the temperature's step (a mask, not a selection: the
        selection's size is the data's, which no compiled graph takes)."""
        burn = batch.burn_in
        net, valid = self.networks, batch.valid[burn:]
        actions, log_probs = squashed_gaussian(self.sequence_policy(batch), noise=noise)
        with torch.no_grad():
            features = [h[:-1] for h in net.critics.features(batch.obs, batch.starts, burn)]
        q_pi = net.critics.q(features, actions[:-1]).min(0).values
        loss = masked_mean(alpha * log_probs[:-1] - q_pi, valid)
        return loss, (log_probs[:-1].detach(), valid)

    def sequence_policy(self, batch: SequenceBatch) -> torch.Tensor:
        """The policy's outputs over a stored sequence after the burn-in, from the carry stored with it refreshed
        over the burn-in without gradients."""
        carry, burn = batch.carry0, batch.burn_in
        if burn > 0:
            with torch.no_grad():
                _, carry = self.networks.policy.unroll(batch.obs[:burn], batch.starts[:burn], carry)
        params, _ = self.networks.policy.unroll(batch.obs[burn:], batch.starts[burn:], carry)
        return params

    def state_dict(self) -> dict[str, Any]:
        return {"networks": self.networks.state_dict(), "policy_optimizer": self.policy_optimizer.state_dict(),
                "critic_optimizer": self.critic_optimizer.state_dict(),
                "alpha_optimizer": self.temperature.optimizer.state_dict(), "gradient_updates": self.gradient_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.networks.load_state_dict(state["networks"])
        self.policy_optimizer.load_state_dict(state["policy_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.temperature.optimizer.load_state_dict(state["alpha_optimizer"])
        self.gradient_updates = state["gradient_updates"]
