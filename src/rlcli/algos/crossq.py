"""CrossQ (Bhatt et al., ICLR 2024), as sb3-contrib implements it: SAC without target networks.

The critics carry Batch Renormalization layers and are evaluated once on the joint batch
[(s, a); (s', a')], so that the current and next state-actions are normalized with the same
statistics; the next-state half, detached, is the bootstrap target. The policy and the temperature
are updated every `policy_delay` critic updates. Modes: the networks stay in eval mode (running
statistics, nothing updated) while acting, testing and computing next actions; only the critics'
joint pass and the policy's own forward pass in its update run in training mode. gSDE (algo.use_sde) as
sb3-contrib: the exploration noise is a linear function of the policy's last (renormalized) features.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlcli.actors.batch_renorm import renorm_mlp
from rlcli.actors.offpolicy import NetworkRecipe, squashed_gaussian
from rlcli.actors.sde import NoiseResampling, StateDependentSquashedPolicy
from rlcli.algos.base import adam
from rlcli.algos.entropy import (
    EntropyCoefficient,
    FixedEntropyCoefficient,
    check_entropy_settings,
    initial_log_alpha,
    learned_temperature_step,
)
from rlcli.algos.loss_step import compile_enabled
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
from rlcli.contracts import ActOutput, AlgoSpec, RecurrentState, ReplayStorage, RunClock, SequenceStorage
from rlcli.registry import ALGOS, require
from rlcli.schedules import Schedule


@contextlib.contextmanager
def training_mode(module: nn.Module) -> Iterator[None]:
    """Batch statistics (and running-statistic updates) inside, eval mode again after."""
    module.train()
    try:
        yield
    finally:
        module.eval()


class CrossQNetworks(nn.Module):
    def __init__(self, recipe: NetworkRecipe, action_dim: int, num_critics: int, critic_hidden_sizes: list[int],
                 log_alpha: float, renorm: dict[str, Any], use_sde: bool = False) -> None:
        super().__init__()
        self.normalizer = recipe.normalizer
        self.policy: nn.Module = renorm_mlp(recipe.obs_dim, recipe.hidden_sizes, action_dim * (1 if use_sde else 2),
                                            recipe.activation, **renorm)
        if use_sde:  # the renormalized features up to the last layer, then the mean and the state-dependent noise
            width = recipe.hidden_sizes[-1] if recipe.hidden_sizes else recipe.obs_dim
            log_std_init = -3.0 if recipe.log_std_init is None else recipe.log_std_init
            self.policy = StateDependentSquashedPolicy(self.policy[:-1], width, self.policy[-1], action_dim,
                                                       log_std_init, recipe.sde.full_std, recipe.sde.use_expln)
        self.critics = nn.ModuleList(
            renorm_mlp(recipe.obs_dim + action_dim, critic_hidden_sizes, 1, recipe.activation, **renorm)
            for _ in range(num_critics))
        self.log_alpha = nn.Parameter(torch.tensor(float(log_alpha)))
        self.action_dim = action_dim
        self.eval()

    def sample(self, obs: torch.Tensor, deterministic: bool = False,
               noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Squashed actions and their log-probs, with gSDE's noise or Gaussian noise (`noise`'s standard-normal
        draws, when the caller drew them: a compiled step)."""
        if isinstance(self.policy, StateDependentSquashedPolicy):
            return self.policy(obs, deterministic, noise)
        return squashed_gaussian(self.policy(obs), deterministic, noise)

    def gradient_step_draws(self, rows: int, device: torch.device,
                            policy_step: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A gradient step's noise for the next actions, then (on a policy step) for the policy's actions: standard
        normal draws, or gSDE's one exploration matrix, the noise of both (sb3-contrib's reset_noise per step)."""
        if isinstance(self.policy, StateDependentSquashedPolicy):
            return self.policy.gradient_step_draws(rows, device)
        shape = (rows, self.action_dim)
        return torch.randn(shape, device=device), torch.randn(shape, device=device) if policy_step else None

    def q_values(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """[N, B] every critic's Q(s, a)."""
        x = torch.cat([obs, actions], -1)
        return torch.stack([critic(x).squeeze(-1) for critic in self.critics])


@ALGOS.register("crossq", spec=AlgoSpec(on_policy=False, action_spaces=("Box",), networks=("mlp",), compiles=True,
                                        population="lockstep"))
class CrossQ(BoxActorCritic):
    ent_coef = FixedEntropyCoefficient()  # algo.schedules.ent_coef, with a fixed algo.ent_coef

    def __init__(
        self,
        recipe: NetworkRecipe,
        action_space: gym.spaces.Space,
        num_envs: int,
        lr: float = 1e-3,
        batch_size: int = 256,
        learning_starts: int = 100,
        train_freq: int = 1,
        train_freq_unit: TrainFreqUnit = "step",  # step | episode (a collect phase lasts until train_freq episodes end,
                                                  # SB3's (n, "episode"))
        gradient_steps: int = 1,
        gamma: float = 0.99,
        policy_delay: int = 3,  # policy and temperature update once per this many critic updates
        num_critics: int = 2,
        critic_hidden_sizes: list[int] = (1024, 1024),  # type: ignore[assignment]
        ent_coef: float | str = "auto",  # auto (tuned toward target_entropy) or a fixed number
        ent_coef_init: float = 1.0,
        target_entropy: float | str = "auto",  # auto = -(action dimensions)
        batch_norm_momentum: float = 0.01,  # how fast the running statistics follow the training batches
        batch_norm_eps: float = 0.001,
        renorm_warmup_steps: int = 100_000,  # forward passes of plain batch statistics before renormalization starts
        adam_beta1: float = 0.5,  # Adam's first-moment decay for every optimizer (sb3-contrib and the paper: 0.5)
        reward_scale: float = 1.0,
        max_grad_norm: float | None = None,
        use_sde: bool = False,  # gSDE (Raffin et al. 2021): state-dependent exploration noise
        sde_sample_freq: int = -1,  # gSDE: new noise matrices every n steps (-1: once per collect phase)
    ) -> None:
        check_offpolicy(lr, batch_size, learning_starts, train_freq, gradient_steps, gamma, 1.0, reward_scale)
        require(not (use_sde and train_freq_unit == "episode"), "algo.train_freq_unit", train_freq_unit,
                "with algo.use_sde=true must be step: gSDE redraws its noise at fixed-length collect phases")
        require(batch_size >= 2, "algo.batch_size", batch_size, "must be >= 2 (batch statistics need two samples)")
        require(policy_delay >= 1, "algo.policy_delay", policy_delay, "must be >= 1")
        require(num_critics >= 1, "algo.num_critics", num_critics, "must be >= 1")
        require(all(h > 0 for h in critic_hidden_sizes), "algo.critic_hidden_sizes", list(critic_hidden_sizes),
                "sizes must be > 0")
        check_entropy_settings(ent_coef, ent_coef_init, target_entropy)
        require(0 < batch_norm_momentum <= 1, "algo.batch_norm_momentum", batch_norm_momentum, "must be in (0, 1]")
        require(batch_norm_eps > 0, "algo.batch_norm_eps", batch_norm_eps, "must be > 0")
        require(renorm_warmup_steps >= 0, "algo.renorm_warmup_steps", renorm_warmup_steps, "must be >= 0")
        require(0 <= adam_beta1 < 1, "algo.adam_beta1", adam_beta1, "must be in [0, 1)")
        require(not recipe.obs_extractor and not recipe.act_extractor, "actor.obs_extractor",
                recipe.obs_extractor or recipe.act_extractor,
                "algo=crossq builds plain renormalized MLPs: use actor.hidden_sizes and algo.critic_hidden_sizes")
        self.scaler = BoxScaler(action_space)
        self.action_dim = int(np.prod(action_space.shape))
        renorm = {"momentum": batch_norm_momentum, "eps": batch_norm_eps, "warmup_steps": renorm_warmup_steps}
        self.networks = CrossQNetworks(recipe, self.action_dim, num_critics, list(critic_hidden_sizes),
                                       initial_log_alpha(ent_coef, ent_coef_init), renorm, use_sde)
        policy = self.networks.policy
        # gSDE: new exploration matrices at each collect phase's start (and every sde_sample_freq steps)
        self.noise_resampling = NoiseResampling(
            policy.noise if isinstance(policy, StateDependentSquashedPolicy) else None, train_freq, sde_sample_freq)
        betas = (adam_beta1, 0.999)  # sb3-contrib's CrossQ: beta1 = 0.5 for every optimizer
        self.policy_optimizer = adam(self.networks.policy.parameters(), lr=lr, betas=betas)
        self.critic_optimizer = adam(self.networks.critics.parameters(), lr=lr, betas=betas)
        self.temperature = EntropyCoefficient(self.networks.log_alpha, ent_coef, target_entropy, self.action_dim, lr,
                                           betas=betas)
        self.steps_per_collect, self.episodes_per_collect = collect_phase(train_freq, train_freq_unit)
        self.batch_size, self.learning_starts = batch_size, learning_starts
        self.gradient_steps = resolve_gradient_steps(gradient_steps, train_freq, num_envs, train_freq_unit)
        self.gamma, self.policy_delay = gamma, policy_delay
        self.reward_scale, self.max_grad_norm = reward_scale, max_grad_norm
        self.gradient_updates = 0
        self.default_schedules: dict[str, Schedule] = {}
        self.schedulable: tuple[str, ...] = ("gamma", "reward_scale", "max_grad_norm", *self.temperature.schedulable)
        # what a population's members may differ in beside seed, lr and max_grad_norm (sweeps/population/lockstep.py)
        self.member_settings = {"temperature.learned": "ent_coef", "temperature.fixed": "ent_coef",
                                "temperature.target_entropy": "target_entropy"}
        # the critics', the policy's and the temperature's steps (compile=true: one graph each, the batch-renorm
        # running statistics updated inside them as inputs)
        self.build_steps(self.critic_loss, self.policy_loss, updates_buffers=True)
        self.temperature_train_step = self.temperature.train_step(self.networks, self)

    def alpha(self) -> torch.Tensor:
        return self.temperature.value()

    @torch.inference_mode()
    def act(self, obs: torch.Tensor, deterministic: bool = False, state: RecurrentState | None = None) -> ActOutput:
        self.noise_resampling.before_act(obs.shape[0], deterministic)
        actions, log_probs = self.networks.sample(obs, deterministic)  # eval mode: running stats
        return ActOutput(actions, log_probs, torch.zeros_like(log_probs))

    def population_refusal(self) -> str | None:
        """What keeps this member out of a batched population (sweeps/population/lockstep.py), or None."""
        if compile_enabled(self):  # its steps update the batch-renorm statistics inside the graph
            return "CrossQ with compile=true"
        return None

    def critic_loss(self, batch: Any, alpha: torch.Tensor,
                    noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The joint pass: Q on [(s, a); (s', a')] in one batch (the caller puts the critics in training mode),
        the s' half (detached, the smallest critic's) as the soft target. Returns the loss and each sample's
        |TD error|. `noise`: the next actions' draws, when the caller drew them."""
        net = self.networks
        with torch.no_grad():  # next actions from the policy in eval mode, as sb3-contrib
            next_actions, next_log_probs = net.sample(batch.next_obs, noise=noise)
        q_all = net.q_values(torch.cat([batch.obs, batch.next_obs]), torch.cat([batch.actions, next_actions]))
        q, q_next = q_all.split(batch.obs.shape[0], dim=1)
        with torch.no_grad():
            next_value = soft_next_value(q_next, next_log_probs, alpha)
            target = self.reward_scale * batch.rewards + batch.discounts * next_value
        return critics_td_loss(q, target, batch.weights, scale=0.5)

    def update(self, buffer: ReplayStorage | SequenceStorage, clock: RunClock) -> dict[str, torch.Tensor]:
        return single_run_update(self, buffer, clock)

    def policy_loss(self, obs: torch.Tensor, alpha: torch.Tensor,
                    noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """alpha * log pi - min Q, the policy's forward pass in training mode (the caller's) and the critics judging
        its actions in eval mode; and the log-probs (detached) for the temperature's step."""
        actions, log_probs = self.networks.sample(obs, noise=noise)
        q_pi = self.networks.q_values(obs, actions).min(0).values
        return (alpha * log_probs - q_pi).mean(), log_probs.detach()

    def _gradient_step(self, batch: Any, run: Runner) -> StepOutput:
        """The critics' step on one batch; every policy_delay-th one, the policy's and the temperature's too; written
        for a runner (algos/runner.py)."""
        net = self.networks
        alpha = run.read(self.alpha)
        delayed = (self.gradient_updates + 1) % self.policy_delay == 0
        rows, device = batch_rows(batch), batch.rewards.device
        # from the run's stream, in the order the losses use them (nothing in between draws)
        next_noise, noise = run.draw(lambda: net.gradient_step_draws(rows, device, delayed))
        with training_mode(net.critics):
            critic_loss, errors = run(self.critic_train_step, batch, alpha, next_noise)
        self.gradient_updates += 1
        metrics = {"value_loss": critic_loss.detach(), "alpha": alpha}
        if delayed:
            with training_mode(net.policy):
                policy_loss, log_probs = run(self.policy_train_step, batch.obs, alpha, noise)  # dQ/da only
            learned_temperature_step(run, self, log_probs)
            metrics |= {"policy_loss": policy_loss.detach(), "entropy": -run.mean(log_probs)}
        return errors, metrics

    def state_dict(self) -> dict[str, Any]:
        return {"networks": self.networks.state_dict(), "policy_optimizer": self.policy_optimizer.state_dict(),
                "critic_optimizer": self.critic_optimizer.state_dict(),
                "alpha_optimizer": self.temperature.optimizer.state_dict(), "gradient_updates": self.gradient_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.networks.load_state_dict(state["networks"])  # the Batch Renorm statistics are buffers in here
        self.policy_optimizer.load_state_dict(state["policy_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.temperature.optimizer.load_state_dict(state["alpha_optimizer"])
        self.gradient_updates = state["gradient_updates"]
