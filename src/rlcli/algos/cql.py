"""Conservative Q-Learning (Kumar et al. 2020) for Box actions: SAC whose critics also push down a soft maximum of Q
over actions the dataset did not take (uniform ones, and the policy's own at s and at s') and push up Q at the
dataset's actions, so the policy cannot climb values the data never backed. Hyperparameters are CORL's
(algorithms/offline/cql.py): an importance-sampled logsumexp over 10 actions of each kind, cql_alpha 10, no entropy
in the backup, the policy's (and the temperature's) learning rate 3e-5 against the critics' 3e-4, and optionally
the Lagrange form that tunes the penalty's weight toward a target gap. Discrete actions: discrete_cql.py.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import gymnasium as gym
import torch
from torch import nn

from rlcli.actors.offpolicy import NetworkRecipe
from rlcli.algos.base import adam
from rlcli.algos.loss_step import LossStep
from rlcli.algos.offpolicy import StepOutput, critics_td_loss
from rlcli.algos.runner import Runner, batch_rows, single_run_update
from rlcli.algos.sac import SAC
from rlcli.batches import ReplayBatch
from rlcli.contracts import AlgoSpec, ReplayStorage, RunClock, SequenceStorage
from rlcli.registry import ALGOS, require


class CQLDraws(NamedTuple):
    """The penalty's random inputs, drawn eagerly from the run's stream (a compiled step takes randomness as an
    input): uniform actions in [-1, 1], and the standard-normal draws of the policy's actions at s and at s'."""

    random_actions: torch.Tensor  # [B, n, A]
    current_noise: torch.Tensor  # [B, n, A]
    next_noise: torch.Tensor  # [B, n, A]


def cql_penalty(q_data: torch.Tensor, q_random: torch.Tensor, q_current: torch.Tensor, q_next: torch.Tensor,
                log_pi_current: torch.Tensor, log_pi_next: torch.Tensor, action_dim: int, temperature: float,
                importance_sample: bool) -> torch.Tensor:
    """Each critic's batch mean of temp * logsumexp(Q(s, .) / temp) - Q(s, a_data), [N]. q_data [N, B]; the
    sampled actions' Q [N, B, n]; their log-probs [B, n]. Importance-sampled (CORL's default): each sample's Q minus
    its proposal's log-density (uniform: log 0.5^A); otherwise the plain logsumexp over the samples and the data's
    action."""
    if importance_sample:
        parts = [q_random - action_dim * math.log(0.5), q_next - log_pi_next, q_current - log_pi_current]
    else:
        parts = [q_random, q_data.unsqueeze(-1), q_next, q_current]
    soft_max = temperature * torch.logsumexp(torch.cat(parts, -1) / temperature, -1)
    return (soft_max - q_data).mean(-1)


def repeat_rows(x: torch.Tensor, n: int) -> torch.Tensor:
    """[B, ...] -> [B * n, ...], each row n times in a row (row b * n + j is x[b])."""
    return x.unsqueeze(1).expand(x.shape[0], n, *x.shape[1:]).reshape(x.shape[0] * n, *x.shape[1:])


@ALGOS.register("cql", spec=AlgoSpec(on_policy=False, action_spaces=("Box",), networks=("mlp",), compiles=True,
                                     offline=True, population="lockstep"))
class CQL(SAC):
    """Conservative Q-Learning (Kumar et al. 2020, offline, Box actions): SAC whose critics push down a logsumexp of Q
    over sampled actions and push up Q at the dataset's."""

    def __init__(
        self,
        recipe: NetworkRecipe,
        action_space: gym.spaces.Space,
        num_envs: int,
        lr: float = 3e-4,  # the critics' (CORL's qf_lr) and the Lagrange multiplier's
        policy_lr: float = 3e-5,  # the policy's and the entropy temperature's
        batch_size: int = 256,
        learning_starts: int = 0,  # offline: learn from the first step
        train_freq: int = 1,  # loop steps between update phases (offline: one gradient step per loop step)
        gradient_steps: int = 1,  # gradient steps per update phase
        cql_alpha: float = 10.0,  # the penalty's weight (CORL's min_q_weight; 5 in its finetune presets)
        cql_n_actions: int = 10,  # uniform actions, and policy actions at s and at s', sampled per state
        cql_temp: float = 1.0,  # temperature of the logsumexp
        cql_importance_sample: bool = True,  # logsumexp of each sample's Q minus its proposal's log-density
        cql_lagrange: bool = False,  # tune the penalty's weight (cql_alpha x alpha') toward cql_target_action_gap
        cql_target_action_gap: float = -1.0,  # the Lagrange form's target for the penalty
        backup_entropy: bool = False,  # subtract alpha x the next action's log-probability in the TD target (SAC's soft
                                       # backup)
        **sac_settings: Any,
    ) -> None:
        require(policy_lr > 0, "algo.policy_lr", policy_lr, "must be > 0")
        require(cql_alpha >= 0, "algo.cql_alpha", cql_alpha, "must be >= 0 (0: plain SAC)")
        require(cql_n_actions >= 1, "algo.cql_n_actions", cql_n_actions, "must be >= 1")
        require(cql_temp > 0, "algo.cql_temp", cql_temp, "must be > 0")
        require(not sac_settings.get("use_sde", False), "algo.use_sde", True,
                "CQL samples the squashed Gaussian policy's actions for its penalty; gSDE is not built for it")
        super().__init__(recipe, action_space, num_envs, lr=lr, batch_size=batch_size,
                         learning_starts=learning_starts, train_freq=train_freq, gradient_steps=gradient_steps,
                         **sac_settings)
        for optimizer in (self.policy_optimizer, self.temperature.optimizer):  # CORL: alpha learns at the policy's
            for group in optimizer.param_groups:
                group["lr"] = policy_lr
        self.cql_alpha, self.cql_n_actions, self.cql_temp = cql_alpha, cql_n_actions, cql_temp
        self.importance_sample, self.lagrange, self.target_gap = cql_importance_sample, cql_lagrange, \
            cql_target_action_gap
        self.backup_entropy = backup_entropy
        # the Lagrange multiplier's log (CORL starts it at 1.0), in the networks so checkpoints and devices carry it
        self.networks.log_alpha_prime = nn.Parameter(torch.tensor(1.0))
        self.alpha_prime_optimizer = adam([self.networks.log_alpha_prime], lr=lr)
        self.alpha_prime_train_step = LossStep(self.networks, self.alpha_prime_optimizer, self.alpha_prime_loss, self)
        self.schedulable += ("cql_alpha",)

    def penalty_weight(self) -> torch.Tensor:
        """cql_alpha, times exp(log alpha') clamped to [0, 1e6] with the Lagrange form."""
        log_alpha_prime = self.networks.log_alpha_prime.detach()
        if not self.lagrange:
            return torch.full_like(log_alpha_prime, self.cql_alpha)
        return self.cql_alpha * log_alpha_prime.exp().clamp(0.0, 1e6)

    def draws(self, batch_size: int, device: torch.device) -> CQLDraws:
        shape = (batch_size, self.cql_n_actions, self.action_dim)
        return CQLDraws(torch.rand(shape, device=device) * 2 - 1, torch.randn(shape, device=device),
                        torch.randn(shape, device=device))

    def update(self, buffer: ReplayStorage | SequenceStorage, clock: RunClock) -> dict[str, torch.Tensor]:
        return single_run_update(self, buffer, clock)

    def _gradient_step(self, batch: Any, run: Runner) -> StepOutput:
        """The critics' step (TD loss + penalty), the policy's, alpha' (Lagrange), then SAC's temperature step and
        target update; written for a runner (algos/runner.py)."""
        alpha, weight = run.read(self.alpha), run.read(self.penalty_weight)
        shape, device = (batch_rows(batch), self.action_dim), batch.rewards.device
        # the policy's draws (next actions', then actions'), then the penalty's, from the run's stream
        next_noise, noise, *penalty_draws = run.draw(lambda: (torch.randn(shape, device=device),
                                                              torch.randn(shape, device=device),
                                                              *self.draws(shape[0], device)))
        critic_loss, (errors, penalty) = run(self.critic_train_step, batch, alpha, next_noise,
                                             CQLDraws(*penalty_draws), weight)
        policy_loss, log_probs = run(self.policy_train_step, batch.obs, alpha, noise)
        if self.lagrange:  # alpha' grows while the penalty stays above the target gap
            run(self.alpha_prime_train_step, penalty)
        self.temperature_and_targets(run, log_probs)
        return errors, {"value_loss": critic_loss.detach(), "policy_loss": policy_loss.detach(), "alpha": alpha,
                        "entropy": -run.mean(log_probs), "cql_penalty": run.mean(penalty), "cql_weight": weight}

    def alpha_prime_loss(self, penalty: torch.Tensor) -> tuple[torch.Tensor, tuple[()]]:
        """The Lagrange multiplier's loss: -alpha' * cql_alpha * (penalty - target gap), alpha' = exp(log alpha')."""
        alpha_prime = self.networks.log_alpha_prime.exp().clamp(0.0, 1e6)
        return -(alpha_prime * self.cql_alpha * (penalty - self.target_gap)).mean(), ()

    def soft_td_loss(self, batch: ReplayBatch, alpha: torch.Tensor, noise: torch.Tensor | None = None,
                     draws: CQLDraws | None = None,
                     weight: torch.Tensor | None = None) -> tuple[torch.Tensor, Any]:
        """Both critics' TD loss toward r + discount min Q_target(s', a' ~ pi) (minus alpha log pi with
        backup_entropy), plus `weight` x the conservative penalty (minus the target gap with the Lagrange form);
        with each transition's |TD error| and each critic's penalty (detached)."""
        net, n = self.networks, self.cql_n_actions
        draws = self.draws(batch.obs.shape[0], batch.obs.device) if draws is None else draws
        weight = self.penalty_weight() if weight is None else weight
        b = batch.obs.shape[0]
        obs_n = repeat_rows(batch.obs, n)
        with torch.no_grad():
            next_actions, next_log_probs = net.policy(batch.next_obs, noise=noise)
            next_q = net.critics_target(batch.next_obs, next_actions).min(0).values
            if self.backup_entropy:
                next_q = next_q - alpha * next_log_probs
            target = self.reward_scale * batch.rewards + batch.discounts * next_q
            # the policy's actions at s and at s' (CORL evaluates both at s), detached
            current, log_pi_current = net.policy(obs_n, noise=draws.current_noise.reshape(b * n, -1))
            following, log_pi_next = net.policy(repeat_rows(batch.next_obs, n),
                                                noise=draws.next_noise.reshape(b * n, -1))
        q_data = net.critics(batch.obs, batch.actions)
        sampled = torch.cat([draws.random_actions.reshape(b * n, -1), current, following])
        q_random, q_current, q_next = net.critics(torch.cat([obs_n] * 3), sampled).reshape(-1, 3, b, n).unbind(1)
        penalty = cql_penalty(q_data, q_random, q_current, q_next, log_pi_current.reshape(b, n),
                              log_pi_next.reshape(b, n), self.action_dim, self.cql_temp, self.importance_sample)
        td_loss, errors = critics_td_loss(q_data, target, batch.weights, scale=1.0)  # CORL: the two MSEs' sum
        gap = self.target_gap if self.lagrange else 0.0
        return td_loss + (weight * (penalty - gap)).sum(), (errors, penalty.detach())

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "alpha_prime_optimizer": self.alpha_prime_optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.alpha_prime_optimizer.load_state_dict(state["alpha_prime_optimizer"])
