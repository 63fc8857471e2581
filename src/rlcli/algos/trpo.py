"""Trust Region Policy Optimization, Schulman et al. 2015, as sb3-contrib implements it.

One policy step per rollout: the natural-gradient direction F^-1 g is solved by conjugate gradient
on Fisher-vector products (the Hessian of the mean KL, never formed), scaled to the KL radius
`target_kl`, then shrunk by a backtracking line search until the surrogate improves and the KL
stays inside the radius (else the policy does not move). The value function is fitted afterwards
by regression (Adam minibatches), on its own parameters only, so it cannot move the policy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from rlcli.actors.heads import GaussianHead, diag_gaussian_kl
from rlcli.actors.mlp import ActorCritic
from rlcli.actors.sde import NoiseResampling, StateDependentGaussianHead, head_noise
from rlcli.algos.addons import PolicyAddon
from rlcli.algos.base import (
    Decay,
    GaeActorCritic,
    adam,
    clipped_env_actions,
    explained_variance,
    masked_mean,
    normalize_masked,
    set_lr,
)
from rlcli.algos.exploration import minibatches
from rlcli.algos.loss_step import LossStep
from rlcli.batches import RolloutBatch
from rlcli.contracts import ON_POLICY_ACTIONS, AlgoSpec, RolloutStorage, RunClock
from rlcli.registry import ALGOS, ConfigError, require
from rlcli.schedules import to_zero

MatVec = Callable[[torch.Tensor], torch.Tensor]


def conjugate_gradient(matvec: MatVec, b: torch.Tensor, max_iter: int, residual_tol: float = 1e-10) -> torch.Tensor:
    """An approximate solution x of A x = b for a symmetric positive definite A given as `matvec`.
    Starts from x = 0 (sb3-contrib starts from small noise; zero keeps the run's RNG untouched)."""
    x = torch.zeros_like(b)
    residual = b.clone()
    direction = b.clone()
    residual_sq = residual @ residual
    for _ in range(max_iter):
        if residual_sq < residual_tol:
            break
        a_direction = matvec(direction)
        alpha = residual_sq / (direction @ a_direction)
        x += alpha * direction
        residual -= alpha * a_direction
        new_residual_sq = residual @ residual
        direction = residual + (new_residual_sq / residual_sq) * direction
        residual_sq = new_residual_sq
    return x


def flat_grad(output: torch.Tensor, params: Sequence[nn.Parameter], **kwargs: Any) -> torch.Tensor:
    """d output / d params as one vector (zeros for parameters the output does not reach)."""
    grads = torch.autograd.grad(output, params, allow_unused=True, **kwargs)
    pairs = zip(grads, params, strict=True)
    return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1) for g, p in pairs])


def assign_flat(params: Sequence[nn.Parameter], flat: torch.Tensor) -> None:
    """Copy a flat vector into the parameters, in order."""
    with torch.no_grad():
        start = 0
        for p in params:
            p.copy_(flat[start:start + p.numel()].view_as(p))
            start += p.numel()


def fisher_vector_product(kl: torch.Tensor, params: Sequence[nn.Parameter], damping: float) -> MatVec:
    """v -> (H + damping I) v, H the Hessian of the mean KL at the current parameters (the Fisher
    matrix there): two backward passes per product, H itself is never formed."""
    kl_gradient = flat_grad(kl, params, create_graph=True)

    def product(v: torch.Tensor) -> torch.Tensor:
        return flat_grad(kl_gradient @ v, params, retain_graph=True) + damping * v

    return product


@ALGOS.register("trpo", spec=AlgoSpec(on_policy=True, networks=("mlp", "cnn"), action_spaces=ON_POLICY_ACTIONS,
                                      compiles=True))
class TRPO(GaeActorCritic):
    def __init__(
        self,
        networks: ActorCritic,
        num_envs: int,
        policy_addons: Sequence[PolicyAddon] = (),
        n_steps: int = 2048,  # env steps per env between updates
        batch_size: int = 128,  # minibatch size of the value regression
        lr: float = 1e-3,  # the value function's Adam learning rate (the policy step has no learning rate)
        lr_schedule: Decay = "constant",  # constant | linear (to 0 at train.total_steps)
        gamma: float = 0.99,
        gae_lambda: float = 0.95,
        target_kl: float = 0.01,  # the trust region: mean KL(old || new) of one policy step stays below this
        cg_max_steps: int = 15,  # conjugate-gradient iterations for the step direction
        cg_damping: float = 0.1,  # added to the Fisher-vector product (F + damping I): steadier solves
        line_search_shrinking_factor: float = 0.8,
        line_search_max_iter: int = 10,  # after that many shrinks without improvement the policy does not move
        n_critic_updates: int = 10,  # epochs of value regression per rollout
        normalize_advantage: bool = True,
        sub_sampling_factor: int = 1,  # the policy step uses every k-th rollout step (faster on big rollouts)
        use_sde: bool = False,  # gSDE (Raffin et al. 2021): state-dependent exploration noise, Box actions, actor=mlp
        sde_sample_freq: int = -1,  # gSDE: new noise matrices every n steps (-1: once per collect phase)
    ) -> None:
        if policy_addons:
            raise ConfigError("algo=trpo does not take algo.policy_loss_addons: its policy step is a trust-region "
                              "solve, not a loss; use algo=ppo or algo=a2c with add-ons")
        rollout = n_steps * num_envs
        require(n_steps > 0, "algo.n_steps", n_steps, "must be > 0")
        require(0 < batch_size <= rollout, "algo.batch_size", batch_size,
                f"must be in [1, n_steps * num_envs = {rollout}]")
        require(lr > 0, "algo.lr", lr, "must be > 0")
        require(0 <= gamma <= 1, "algo.gamma", gamma, "must be in [0, 1]")
        require(0 <= gae_lambda <= 1, "algo.gae_lambda", gae_lambda, "must be in [0, 1]")
        require(target_kl > 0, "algo.target_kl", target_kl, "must be > 0 (the trust region's KL radius)")
        require(cg_max_steps > 0, "algo.cg_max_steps", cg_max_steps, "must be > 0")
        require(cg_damping >= 0, "algo.cg_damping", cg_damping, "must be >= 0")
        require(0 < line_search_shrinking_factor < 1, "algo.line_search_shrinking_factor",
                line_search_shrinking_factor, "must be in (0, 1)")
        require(line_search_max_iter > 0, "algo.line_search_max_iter", line_search_max_iter, "must be > 0")
        require(n_critic_updates >= 0, "algo.n_critic_updates", n_critic_updates, "must be >= 0")
        require(0 < sub_sampling_factor <= rollout, "algo.sub_sampling_factor", sub_sampling_factor,
                f"must be in [1, n_steps * num_envs = {rollout}]")
        self.networks = networks
        self.n_steps, self.batch_size = n_steps, batch_size
        self.steps_per_collect = n_steps
        self.noise_resampling = NoiseResampling(head_noise(networks.head, use_sde), n_steps, sde_sample_freq)
        self.gamma, self.gae_lambda = gamma, gae_lambda
        self.target_kl, self.cg_max_steps, self.cg_damping = target_kl, cg_max_steps, cg_damping
        self.line_search_shrinking_factor = line_search_shrinking_factor
        self.line_search_max_iter = line_search_max_iter
        self.n_critic_updates, self.normalize_advantage = n_critic_updates, normalize_advantage
        self.sub_sampling_factor = sub_sampling_factor
        self.schedulable: tuple[str, ...] = ("lr_scale", "gamma", "gae_lambda", "target_kl", "cg_damping",
                                             "line_search_shrinking_factor")
        self.lr_scale = 1.0  # lr_schedule=linear: a factor from 1 to 0, set by the trainer's schedules
        linear = to_zero(lr_schedule)
        self.default_schedules = {"lr_scale": linear} if linear else {}
        groups = networks.param_groups()
        # The trust region covers everything the policy reads (a shared body or encoder included);
        # the value regression steps only the value function's own parameters, as in sb3-contrib.
        self.policy_parameters = groups["shared"] + groups["pi"]
        self.value_parameters = groups["v"]
        self.value_optimizer = adam([{"params": self.value_parameters, "lr": lr, "base_lr": lr}], eps=1e-5)
        # the value function's minibatch step (no clip), on its own parameters only: a shared body is the policy's.
        # compile=true compiles it; the natural-gradient step stays eager (its conjugate gradient and line search
        # decide in Python how far to go).
        self.value_train_step = LossStep(networks, self.value_optimizer, self.value_loss)

    def update(self, buffer: RolloutStorage, clock: RunClock) -> dict[str, torch.Tensor]:
        lr = set_lr(self.value_optimizer, self.lr_scale)
        batch = buffer.flat()
        step = self.sub_sampling_factor
        metrics = self.policy_step(RolloutBatch(*(x[::step] for x in batch[:7])))
        metrics["value_loss"] = self.fit_value(batch)
        metrics["explained_variance"] = explained_variance(batch.values, batch.returns, batch.mask)
        metrics["learning_rate"] = torch.tensor(lr)
        head = self.networks.head
        if isinstance(head, GaussianHead):
            metrics["std"] = head.log_std.detach().exp().mean()
        elif isinstance(head, StateDependentGaussianHead):
            metrics["std"] = head.noise.std().detach().mean()  # gSDE: of the noise matrices' entries
        return metrics

    # ---------------------------------------------------------------------------------- policy step
    def _kl(self, old: tuple[torch.Tensor, torch.Tensor | None], new: torch.Tensor) -> torch.Tensor:
        """KL(old || new) per state; `old` is the head's output before the step (and a Gaussian head's log std,
        which is not in its output)."""
        old_params, old_log_std = old
        head = self.networks.head
        if isinstance(head, GaussianHead):
            assert old_log_std is not None
            return diag_gaussian_kl(old_params, old_log_std, new, head.log_std)
        return head.kl(old_params, new)

    def policy_step(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """One natural-gradient step inside the KL radius, found by line search."""
        networks, mask, params = self.networks, batch.mask, self.policy_parameters
        advantages = batch.advantages
        if self.normalize_advantage and advantages.numel() > 1:
            advantages = normalize_masked(advantages, mask)
        with torch.no_grad():
            head = networks.head
            old = (networks.policy_params(batch.obs), head.log_std.clone() if isinstance(head, GaussianHead) else None)

        def surrogate_and_kl() -> tuple[torch.Tensor, torch.Tensor]:
            new = networks.policy_params(batch.obs)
            ratio = torch.exp(networks.head.log_prob(new, batch.actions) - batch.log_probs)
            return masked_mean(advantages * ratio, mask), masked_mean(self._kl(old, new), mask)

        objective, kl = surrogate_and_kl()
        gradient = flat_grad(objective, params, retain_graph=True)
        fisher_vector = fisher_vector_product(kl, params, self.cg_damping)
        direction = conjugate_gradient(fisher_vector, gradient.detach(), self.cg_max_steps)
        curvature = float(direction @ fisher_vector(direction))
        objective = objective.detach()
        stats = {"policy_objective": objective, "kl": torch.tensor(0.0), "line_search_success": torch.tensor(0.0),
                 "step_fraction": torch.tensor(0.0)}
        if not (curvature > 0 and math.isfinite(curvature)):  # a zero gradient: nothing to step along
            return stats
        max_step = math.sqrt(2 * self.target_kl / curvature)
        original = torch.cat([p.detach().reshape(-1) for p in params])
        fraction = 1.0
        with torch.no_grad():
            for _ in range(self.line_search_max_iter):
                assign_flat(params, original + fraction * max_step * direction)
                new_objective, new_kl = surrogate_and_kl()
                if new_kl < self.target_kl and new_objective > objective:
                    return {"policy_objective": new_objective, "kl": new_kl,
                            "line_search_success": torch.tensor(1.0), "step_fraction": torch.tensor(fraction)}
                fraction *= self.line_search_shrinking_factor
            assign_flat(params, original)  # no step kept both promises: the policy stays where it was
        return stats

    # ------------------------------------------------------------------------------------ value fit
    def fit_value(self, batch: RolloutBatch) -> torch.Tensor:
        """n_critic_updates epochs of shuffled minibatch regression of V onto the returns."""
        size, device = batch.mask.shape[0], batch.mask.device
        total, count = torch.zeros((), device=device), 0
        for _ in range(self.n_critic_updates):
            for idx in minibatches(size, self.batch_size, device):
                loss, _ = self.value_train_step(batch.obs[idx], batch.returns[idx], batch.mask[idx])
                total, count = total + loss.detach(), count + 1
        return total / max(count, 1)

    def value_loss(self, obs: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return masked_mean((self.networks.value(obs) - returns).square(), mask), {}

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.value_optimizer]

    def env_actions(self, actions: torch.Tensor) -> torch.Tensor:
        return clipped_env_actions(self.networks, actions)

    def state_dict(self) -> dict[str, Any]:
        return {"networks": self.networks.state_dict(), "value_optimizer": self.value_optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.networks.load_state_dict(state["networks"])
        self.value_optimizer.load_state_dict(state["value_optimizer"])
