"""Generalized state-dependent exploration (gSDE; Raffin et al. 2021, "Smooth Exploration for Robotic
Reinforcement Learning"), with Stable-Baselines3's meaning of every setting.

The exploration noise is a linear function of the policy's last hidden features, `noise = latent @ W`,
with `W ~ N(0, std^2)` drawn once and kept for a while (every `sde_sample_freq` steps, and at each collect
phase's start) instead of fresh Gaussian noise at every step: the same state gives the same perturbation,
so exploration is smooth in time. Given the features, the action is Gaussian with mean `mu(s)` and
variance `(latent^2) @ (std^2)` per action dimension; that is what log-probs and entropies are taken of.
As in SB3, the on-policy heads take the features into the noise and the variance detached
(`learn_features=False`); SAC, TQC and CrossQ's squashed policies let gradients through them (True).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rlcli.registry import ConfigError, require

_LOG_2PI = math.log(2 * math.pi)
VARIANCE_EPSILON = 1e-6  # keeps the std > 0 where the features are all zero (SB3's epsilon)


@dataclass(frozen=True)
class SdeOptions:
    """actor.full_std: one std per (feature, action) pair, or per feature (shared by the actions);
    actor.use_expln: a std that grows as log1p above 1 instead of exp (SB3's meanings and defaults)."""

    full_std: bool = True
    use_expln: bool = False


class StateDependentNoise(nn.Module):
    """gSDE's learned log std (a matrix: features x actions, or features x 1 with `full_std=false`) and the
    current exploration matrices, one per env (`reset_noise(n)`). The matrices are kept as the standard normal
    draws `eps` (saved with the networks, so a resumed run explores with the same matrices); the weights are
    `eps * std`, differentiable in the log std (the reparameterization that SAC's policy loss uses)."""

    def __init__(self, latent_dim: int, action_dim: int, log_std_init: float, full_std: bool = True,
                 use_expln: bool = False, learn_features: bool = False) -> None:
        super().__init__()
        self.latent_dim, self.action_dim = latent_dim, action_dim
        self.full_std, self.use_expln, self.learn_features = full_std, use_expln, learn_features
        self.log_std = nn.Parameter(torch.full((latent_dim, action_dim if full_std else 1), float(log_std_init)))
        self.register_buffer("eps", torch.zeros(1, latent_dim, action_dim))

    def std(self) -> torch.Tensor:
        """[latent_dim, action_dim]. `use_expln`: exp(x) below 0, log1p(x) + 1 above: the std grows only
        logarithmically, which keeps it from exploding in long runs."""
        log_std = self.log_std
        if self.use_expln:
            below = torch.exp(log_std) * (log_std <= 0)
            safe = log_std * (log_std > 0) + VARIANCE_EPSILON
            std = below + (torch.log1p(safe) + 1.0) * (log_std > 0)
        else:
            std = log_std.exp()
        return std.expand(self.latent_dim, self.action_dim)

    def draw_matrices(self, n: int = 1) -> torch.Tensor:
        """`n` exploration matrices' standard-normal draws, [n, latent_dim, action_dim]. From torch's CPU generator,
        which checkpoints save, then moved to the networks' device: CPU and GPU runs explore alike."""
        return torch.randn(n, self.latent_dim, self.action_dim).to(self.eps.device, self.eps.dtype)

    def reset_noise(self, n: int = 1) -> None:
        """New exploration matrices for acting, one per env."""
        with torch.inference_mode(False):  # also when called while acting under inference mode
            self.eps = self.draw_matrices(n)

    def noise(self, latent: torch.Tensor, eps: torch.Tensor | None = None) -> torch.Tensor:
        """[B, action_dim]: each row's features times its env's matrix when there is one matrix per row, else
        times the first matrix (a training batch, or acting in a different number of envs). `eps`: the matrices'
        draws when the caller drew them (a gradient step's), else acting's own."""
        weights = (self.eps if eps is None else eps) * self.std()
        latent = latent if self.learn_features else latent.detach()
        if weights.shape[0] == latent.shape[0] and latent.shape[0] > 1:
            return torch.bmm(latent.unsqueeze(1), weights).squeeze(1)
        return latent @ weights[0]

    def action_std(self, latent: torch.Tensor) -> torch.Tensor:
        """[B, action_dim]: the std of the action given the features, sqrt((latent^2) @ (std^2) + epsilon)."""
        latent = latent if self.learn_features else latent.detach()
        return torch.sqrt(latent.square() @ self.std().square() + VARIANCE_EPSILON)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        # the saved matrices may be for another number of envs than this module was made with: take their shape
        saved = state_dict.get(prefix + "eps")
        if isinstance(saved, torch.Tensor):
            self.eps = torch.zeros(saved.shape, dtype=self.eps.dtype, device=self.eps.device)
        super()._load_from_state_dict(state_dict, prefix, *args)


def gaussian_log_prob(mean: torch.Tensor, std: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Log-density of a diagonal Gaussian, summed over action dimensions."""
    z = (actions - mean) / std
    return (-0.5 * z.square() - std.log() - 0.5 * _LOG_2PI).sum(-1)


def gaussian_entropy(std: torch.Tensor) -> torch.Tensor:
    return (0.5 + 0.5 * _LOG_2PI + std.log()).sum(-1)


class StateDependentGaussianHead(nn.Module):
    """On-policy Box actions with gSDE (PPO, A2C, TRPO). The head's output, what `sample`, `log_prob`,
    `entropy` and `kl` read, is [mean, std, features] side by side: [B, 2 * action_dim + latent_dim].

    Like GaussianHead, samples are stored unclipped and the collector clips them to the bounds."""

    def __init__(self, in_features: int, action_dim: int, log_std_init: float, full_std: bool = True,
                 use_expln: bool = False) -> None:
        super().__init__()
        self.action_dim = action_dim
        self.mean = nn.Linear(in_features, action_dim)
        self.noise = StateDependentNoise(in_features, action_dim, log_std_init, full_std, use_expln)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.mean(features), self.noise.action_std(features), features.detach()], -1)

    def _split(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a = self.action_dim
        return params[..., :a], params[..., a:2 * a], params[..., 2 * a:]

    def sample(self, params: torch.Tensor, deterministic: bool) -> torch.Tensor:
        mean, _, latent = self._split(params)
        return mean if deterministic else mean + self.noise.noise(latent)

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        mean, std, _ = self._split(params)
        return gaussian_log_prob(mean, std, actions)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        return gaussian_entropy(self._split(params)[1])

    def kl(self, p_params: torch.Tensor, q_params: torch.Tensor, p_head: nn.Module | None = None) -> torch.Tensor:
        """KL(p || q) per state; both stds are in the parameters (they depend on the state)."""
        p_mean, p_std, _ = self._split(p_params)
        q_mean, q_std, _ = self._split(q_params)
        log_ratio = p_std.log() - q_std.log()
        return 0.5 * ((2 * log_ratio).exp() + ((p_mean - q_mean) / q_std).square() - 1 - 2 * log_ratio).sum(-1)


class StateDependentSquashedPolicy(nn.Module):
    """SAC / TQC / CrossQ's policy with gSDE: a = tanh(u), u = mean(s) + latent @ W, where the mean is clipped to
    [-clip_mean, clip_mean] (SB3's default 2.0: keeps tanh out of saturation) and the log-prob of u is the
    state-dependent Gaussian's, minus the tanh change of variables. The features get gradients through the
    noise and the std too (SB3's squashed policies set learn_features=True)."""

    def __init__(self, body: nn.Module, width: int, mean: nn.Linear, action_dim: int, log_std_init: float,
                 full_std: bool = True, use_expln: bool = False, clip_mean: float = 2.0) -> None:
        super().__init__()
        self.body, self.mu = body, mean
        self.noise = StateDependentNoise(width, action_dim, log_std_init, full_std, use_expln, learn_features=True)
        self.clip_mean = clip_mean

    def forward(self, obs: torch.Tensor, deterministic: bool = False,
                noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.sample(self.outputs(obs), deterministic, noise)

    def gradient_step_draws(self, rows: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """A gradient step's noise for the next actions and for the policy's: one fresh exploration matrix, the
        noise of both (SB3's reset_noise before each gradient step)."""
        matrix = self.noise.draw_matrices(1)
        return matrix, matrix

    def outputs(self, obs: torch.Tensor) -> torch.Tensor:
        """[..., action_dim + width]: the (clipped) means and the features side by side, what `sample` draws from
        (a population computes them for all its members at once, then each member samples with its own matrices)."""
        latent = self.body(obs)
        mean = self.mu(latent)
        if self.clip_mean > 0:
            mean = mean.clamp(-self.clip_mean, self.clip_mean)
        return torch.cat([mean, latent], -1)

    def sample(self, params: torch.Tensor, deterministic: bool = False,
               noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Squashed actions and their log-probs from `outputs`, explored with the exploration matrices `noise` (a
        gradient step's draws) or else acting's current ones."""
        mean, latent = params[..., :self.noise.action_dim], params[..., self.noise.action_dim:]
        if deterministic:
            return torch.tanh(mean), torch.zeros(mean.shape[:-1], device=mean.device)
        u = mean + self.noise.noise(latent, noise)
        log_prob = gaussian_log_prob(mean, self.noise.action_std(latent), u)
        # log|d tanh(u)/du| = 2 (log 2 - u - softplus(-2u)), numerically stable
        log_prob = log_prob - (2 * (math.log(2) - u - nn.functional.softplus(-2 * u))).sum(-1)
        return torch.tanh(u), log_prob


class NoiseResampling:
    """When gSDE draws new exploration matrices while acting: at the first step of each collect phase and then
    every `sample_freq` steps of it (SB3's `sde_sample_freq`; -1 or 0: once per phase). Counts the exploring
    `act` calls, of which every collect phase makes exactly `steps_per_collect` (the off-policy warm-up's
    random actions make none), so the count is at a phase boundary whenever a run is saved. With `noise`
    None (no gSDE) it does nothing, so an algorithm calls it the same way either way."""

    def __init__(self, noise: StateDependentNoise | None, steps_per_collect: int, sample_freq: int) -> None:
        require(sample_freq >= -1, "algo.sde_sample_freq", sample_freq,
                "must be >= 1 (new noise every that many steps), or -1 / 0 (once per collect phase)")
        self.noise, self.steps_per_collect, self.sample_freq = noise, steps_per_collect, sample_freq
        self.steps = 0

    def before_act(self, n_envs: int, deterministic: bool) -> None:
        if self.noise is None or deterministic:
            return
        step = self.steps % self.steps_per_collect
        if step == 0 or (self.sample_freq > 0 and step % self.sample_freq == 0):
            self.noise.reset_noise(n_envs)
        self.steps += 1


def head_noise(head: nn.Module, use_sde: bool) -> StateDependentNoise | None:
    """An on-policy network's gSDE noise; a one-line error when `algo.use_sde` and the head disagree (the
    network was built without the algorithm's setting)."""
    has_sde = isinstance(head, StateDependentGaussianHead)
    if has_sde != use_sde:
        raise ConfigError(f"algo.use_sde={str(use_sde).lower()} but the network was built "
                          f"{'with' if has_sde else 'without'} a gSDE head: build both from one config")
    return head.noise if isinstance(head, StateDependentGaussianHead) else None
