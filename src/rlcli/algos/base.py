"""Small pieces the algorithms share (the contract itself is in rlcli/contracts.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import torch
from torch import nn

from rlcli.actors.mlp import ActorCritic
from rlcli.batches import RolloutBatch
from rlcli.contracts import ActOutput, RecurrentState, RolloutStorage
from rlcli.registry import require

Decay = Literal["constant", "linear"]  # the legacy `<x>_schedule` keys: linear = a factor from 1 to 0


def adam(params: Any, lr: float = 1e-3, eps: float = 1e-8, betas: tuple[float, float] = (0.9, 0.999)) -> Any:
    """Adam with the fused kernel (one call for all tensors). The default per-tensor loop costs
    about a quarter of a small PPO minibatch step on a CPU; see rlcli/algos/optim.py for the rest."""
    from rlcli.algos.optim import FusedAdam, fused_adam_available

    if fused_adam_available():
        return FusedAdam(params, lr=lr, eps=eps, betas=betas)
    return torch.optim.Adam(params, lr=lr, eps=eps, betas=betas)


@contextlib.contextmanager
def frozen(module: nn.Module) -> Iterator[None]:
    """Gradients flow through `module` to its inputs but are not computed for its weights:
    an actor loss through the critics then skips a third of the critics' backward matmuls."""
    params = [p for p in module.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


def evaluate_batch(actor: Any, batch: RolloutBatch) -> Any:
    """log-probs, entropies and values of a rollout batch: flat for MLPs, unrolled for recurrent actors."""
    if batch.starts is None:
        if batch.action_masks is not None:  # maskable_ppo: the policy over the valid actions
            return actor.evaluate(batch.obs, batch.actions, batch.action_masks)
        return actor.evaluate(batch.obs, batch.actions)
    steps, envs = batch.starts.shape
    return actor.evaluate_sequence(batch.obs.reshape(steps, envs, *batch.obs.shape[1:]),
                                   batch.actions.reshape(steps, envs, *batch.actions.shape[1:]),
                                   batch.starts, batch.carry0)


def gradient_step(
    optimizer: torch.optim.Optimizer, loss: torch.Tensor, params: Any, max_grad_norm: float | None
) -> None:
    """zero_grad -> backward -> optional global grad-norm clip over `params` -> step."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if max_grad_norm is not None:
        nn.utils.clip_grad_norm_(params, max_grad_norm, foreach=True)
    optimizer.step()


class _LossMode:
    """Whether the losses' tensors carry a leading members axis (`members_first`). A plain attribute, not a
    ContextVar: torch.compile traces reading it (a guard on its value), where ContextVar.get broke a compiled
    run's graph at every mean (a compiled PPO update took 58.6 ms against 15.7 ms)."""

    members_first = False


_LOSS_MODE = _LossMode()


@contextlib.contextmanager
def members_first() -> Iterator[None]:
    """Within it, a loss's tensors carry a leading members axis ([members, batch, ...], a population's minibatches)
    and each mean is each member's own, kept as [members, 1] so that it broadcasts against the members' rows and
    their coefficients ([members, 1]). A population's eager step calls the algorithms' own losses this way instead of
    under vmap (sweeps/population/lockstep.py), where its first call gives vmap's numbers bit for bit
    (sweeps/population/acting.CheckedFastPath)."""
    before, _LOSS_MODE.members_first = _LOSS_MODE.members_first, True
    try:
        yield
    finally:
        _LOSS_MODE.members_first = before


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if _LOSS_MODE.members_first:
        dims = tuple(range(1, mask.dim()))
        return (x * mask).sum(dims, keepdim=True) / mask.sum(dims, keepdim=True).clamp_min(1.0)
    return (x * mask).sum() / mask.sum().clamp_min(1.0)


def normalize_masked(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    mean = masked_mean(x, mask)
    std = masked_mean((x - mean).square(), mask).sqrt()
    return (x - mean) / (std + eps)


def explained_variance(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 - Var[target - pred] / Var[target] over real transitions (nan when the target is constant)."""
    var_target = masked_mean((target - masked_mean(target, mask)).square(), mask)
    resid = target - pred
    var_resid = masked_mean((resid - masked_mean(resid, mask)).square(), mask)
    return torch.where(var_target > 0, 1 - var_resid / var_target, torch.full_like(var_target, float("nan")))


def finish_with_gae(value: Any, buffer: Any, last_obs: torch.Tensor, state: RecurrentState | None, gamma: float,
                    gae_lambda: float) -> None:
    """The usual end of a rollout: bootstrap from V(last_obs) (`value(obs, state)`), then GAE and returns."""
    with torch.inference_mode():
        last_values = value(last_obs, state)
    buffer.compute_returns(last_values, gamma, gae_lambda)


class GaeActorCritic:
    """How the actor-critics that learn from GAE (A2C, PG, PPO, TRPO) act and end a rollout: the network acts, gSDE's
    exploration matrices resampled when `noise_resampling` says; the rollout bootstraps from V(last_obs)."""

    networks: Any
    noise_resampling: Any  # actors/sde.NoiseResampling
    gamma: float
    gae_lambda: float

    @torch.inference_mode()
    def act(self, obs: torch.Tensor, deterministic: bool = False, state: RecurrentState | None = None) -> ActOutput:
        self.noise_resampling.before_act(obs.shape[0], deterministic)
        out: ActOutput = self.networks.act(obs, deterministic, state)
        return out

    def finish_rollout(self, buffer: RolloutStorage, last_obs: torch.Tensor, state: RecurrentState | None) -> None:
        finish_with_gae(self.networks.value, buffer, last_obs, state, self.gamma, self.gae_lambda)

    def act_on(self, params: torch.Tensor, values: torch.Tensor, deterministic: bool = False,
               uniforms: torch.Tensor | None = None) -> ActOutput:
        """`act`'s draw from the policy head's parameters and the values a population computed for all members
        (gSDE's exploration matrices resampled first, when `act` would resample them); `uniforms`: the draw taken
        beforehand (`networks.draw`: a categorical head's, never gSDE's), where a population acts for all its
        members in one call."""
        if uniforms is None:
            self.noise_resampling.before_act(params.shape[0], deterministic)
        out: ActOutput = self.networks.sampled(params, values, deterministic, uniforms)
        return out


def param_groups(actor: ActorCritic, lr: float, lr_pi: float | None, lr_v: float | None) -> list[dict[str, Any]]:
    """Optimizer groups with optional separate policy / value learning rates (`base_lr` kept for schedules)."""
    groups = actor.param_groups()
    rates = {"shared": lr, "pi": lr if lr_pi is None else lr_pi, "v": lr if lr_v is None else lr_v}
    return [
        {"params": params, "lr": rates[name], "base_lr": rates[name], "name": name}
        for name, params in groups.items()
        if params
    ]


def set_lr(optimizer: torch.optim.Optimizer, factor: float) -> float:
    for group in optimizer.param_groups:
        group["lr"] = group["base_lr"] * factor
    return optimizer.param_groups[0]["lr"]


def check_common(
    n_steps: int, lr: float, lr_pi: float | None, lr_v: float | None, gamma: float, gae_lambda: float,
    ent_coef: float, vf_coef: float, max_grad_norm: float | None,
) -> None:
    require(n_steps > 0, "algo.n_steps", n_steps, "must be > 0")
    for key, value in (("algo.lr", lr), ("algo.lr_pi", lr_pi), ("algo.lr_v", lr_v)):
        require(value is None or value > 0, key, value, "must be > 0")
    require(0 <= gamma <= 1, "algo.gamma", gamma, "must be in [0, 1]")
    require(0 <= gae_lambda <= 1, "algo.gae_lambda", gae_lambda, "must be in [0, 1]")
    require(ent_coef >= 0, "algo.ent_coef", ent_coef, "must be >= 0")
    require(vf_coef >= 0, "algo.vf_coef", vf_coef, "must be >= 0")
    require(max_grad_norm is None or max_grad_norm > 0, "algo.max_grad_norm", max_grad_norm, "must be > 0 or null")


def clipped_env_actions(actor: ActorCritic, actions: torch.Tensor) -> torch.Tensor:
    """Gaussian samples are stored unclipped (exact log-probs); the env gets them clipped to its bounds.
    MultiDiscrete / MultiBinary entries are stored as floats; the env gets integers (from each entry's start)."""
    if actor.action_bounds is not None:
        return actions.clamp(*actor.action_bounds.on(actions.device))
    if actor.action_start is not None:
        (start,) = actor.action_start.on(actions.device)
        return actions.long() + start.long()
    return actions


def refuse_in_population(networks: Any, addons: Sequence[Any]) -> str | None:
    """What keeps an on-policy algorithm's update out of a batched population (None: nothing). gSDE batches: its
    exploration matrices only shape acting, which each member does with its own (`act_on`)."""
    from rlcli.actors.recurrent import RecurrentActorCritic

    reasons = [(isinstance(networks, RecurrentActorCritic), "a recurrent actor"),
               (bool(addons), "algo.policy_loss_addons")]
    return next((what for bad, what in reasons if bad), None)
