"""Proximal Policy Optimization, Schulman et al. 2017: the clipped surrogate (`ppo`) or the
adaptive KL penalty (`ppo_kl`: the same class with `kl_coef` set and, by default, no clipping)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import torch

from rlcli.actors.mlp import ActorCritic
from rlcli.actors.recurrent import RecurrentActorCritic
from rlcli.actors.sde import NoiseResampling, head_noise
from rlcli.algos.addons import PolicyAddon, addon_coefs, addon_losses
from rlcli.algos.base import (
    Decay,
    GaeActorCritic,
    adam,
    check_common,
    clipped_env_actions,
    evaluate_batch,
    explained_variance,
    masked_mean,
    normalize_masked,
    param_groups,
    refuse_in_population,
    set_lr,
)
from rlcli.algos.exploration import minibatches
from rlcli.algos.loss_step import LossStep
from rlcli.algos.losses import clipped_surrogate_loss, squared_value_loss
from rlcli.algos.runner import Runner, batch_rows, means, single_rollout_update
from rlcli.batches import RolloutBatch
from rlcli.contracts import ON_POLICY_ACTIONS, AlgoSpec, RolloutStorage, RunClock
from rlcli.registry import ALGOS, require
from rlcli.schedules import to_zero

PPO_SCHEDULABLE: tuple[str, ...] = ("lr_scale", "clip_range", "clip_range_scale", "clip_range_vf", "ent_coef",
                                    "vf_coef", "gamma", "gae_lambda", "max_grad_norm", "target_kl", "kl_coef",
                                    "kl_target")


@ALGOS.register("ppo", spec=AlgoSpec(on_policy=True, compiles=True, action_spaces=ON_POLICY_ACTIONS,
                                     population="on_policy"))
class PPO(GaeActorCritic):
    def __init__(
        self,
        networks: ActorCritic,
        num_envs: int,
        policy_addons: Sequence[PolicyAddon] = (),
        n_steps: int = 2048,  # env steps per env between updates
        batch_size: int = 64,  # minibatch size
        n_epochs: int = 10,
        lr: float = 3e-4,
        lr_pi: float | None = None,  # optional separate learning rates (default: lr)
        lr_v: float | None = None,
        lr_schedule: Decay = "constant",  # constant | linear (to 0 at train.total_steps)
        gamma: float = 0.99,
        gae_lambda: float = 0.95,
        clip_range: float | None = 0.2,
        clip_range_schedule: Decay = "constant",
        clip_range_vf: float | None = None,  # null: unclipped value loss; a number clips value updates like clip_range
        normalize_advantage: bool = True,
        ent_coef: float = 0.0,
        vf_coef: float = 0.5,
        max_grad_norm: float | None = 0.5,
        target_kl: float | None = None,  # stop the epochs early when approx_kl exceeds this
        kl_coef: float | None = None,  # a number adds the adaptive KL penalty (see algo=ppo_kl)
        kl_target: float = 0.01,  # halve the coefficient below target/1.5, double it above 1.5 x target
        use_sde: bool = False,  # gSDE (Raffin et al. 2021): state-dependent exploration noise, Box actions, actor=mlp
        sde_sample_freq: int = -1,  # gSDE: new noise matrices every n steps (-1: once per collect phase)
    ) -> None:
        check_common(n_steps, lr, lr_pi, lr_v, gamma, gae_lambda, ent_coef, vf_coef, max_grad_norm)
        rollout = n_steps * num_envs
        require(0 < batch_size <= rollout, "algo.batch_size", batch_size,
                f"must be in [1, n_steps * num_envs = {rollout}]")
        require(n_epochs > 0, "algo.n_epochs", n_epochs, "must be > 0")
        require(clip_range is None or clip_range > 0, "algo.clip_range", clip_range,
                "must be > 0 (or null with kl_coef)")
        require(clip_range is not None or kl_coef is not None, "algo.clip_range", clip_range,
                "may be null only with the KL penalty (algo=ppo_kl, or set algo.kl_coef)")
        require(kl_coef is None or kl_coef >= 0, "algo.kl_coef", kl_coef, "must be >= 0 or null")
        require(kl_target > 0, "algo.kl_target", kl_target, "must be > 0")
        self.recurrent = isinstance(networks, RecurrentActorCritic)
        require(not self.recurrent or batch_size % n_steps == 0, "algo.batch_size", batch_size,
                f"must be a multiple of algo.n_steps={n_steps} with a recurrent actor (minibatches are whole env "
                "sequences)")
        require(clip_range_vf is None or clip_range_vf > 0, "algo.clip_range_vf", clip_range_vf, "must be > 0 or null")
        require(target_kl is None or target_kl > 0, "algo.target_kl", target_kl, "must be > 0 or null")
        self.networks = networks
        self.policy_addons = list(policy_addons)  # extra policy-loss terms (rlcli/algos/addons.py)
        self.n_steps, self.batch_size, self.n_epochs = n_steps, batch_size, n_epochs
        self.steps_per_collect = n_steps
        self.noise_resampling = NoiseResampling(head_noise(networks.head, use_sde), n_steps, sde_sample_freq)
        self.gamma, self.gae_lambda = gamma, gae_lambda
        self.clip_range = clip_range
        # lr_schedule / clip_range_schedule = linear: factors from 1 to 0, set by the trainer's schedules
        self.lr_scale, self.clip_range_scale = 1.0, 1.0
        implied = {"lr_scale": to_zero(lr_schedule), "clip_range_scale": to_zero(clip_range_schedule)}
        self.default_schedules = {name: schedule for name, schedule in implied.items() if schedule is not None}
        self.clip_range_vf, self.normalize_advantage = clip_range_vf, normalize_advantage
        self.ent_coef, self.vf_coef, self.max_grad_norm, self.target_kl = ent_coef, vf_coef, max_grad_norm, target_kl
        self.kl_coef, self.kl_target = kl_coef, kl_target
        self.schedulable = PPO_SCHEDULABLE
        self.optimizer = adam(param_groups(networks, lr, lr_pi, lr_v) + self.extra_param_groups(lr), eps=1e-5)
        self.train_step = LossStep(self.trained_modules(), self.optimizer, self.minibatch_loss, clip_of=self)
        # an auxiliary loss's draws are taken at each step (rnd_ppo's), from the run's stream
        self.steps_draw = type(self).auxiliary_noise is not PPO.auxiliary_noise
        # what members of a population may differ in: what the update reads per member
        self.member_settings = {k: k for k in ("lr_scale", "clip_range", "clip_range_scale", "ent_coef", "vf_coef",
                                               "kl_coef", "kl_target", "target_kl", "gae_lambda")}

    def update(self, buffer: RolloutStorage, clock: RunClock) -> dict[str, torch.Tensor]:
        return single_rollout_update(self, buffer, clock)

    def _update(self, batch: RolloutBatch, run: Runner) -> dict[str, torch.Tensor]:
        """Epochs of shuffled minibatches (of steps, or of whole env sequences for a recurrent actor), each a
        gradient step, until the last epoch or algo.target_kl's early stop; the steps' mean metrics."""
        clip, ent_coef, vf_coef, kl_coef = run.read(self.settings)
        size, device = batch_rows(batch), batch.mask.device
        # every epoch runs (no target_kl) and no step draws: all orders in one turn of the stream, the same numbers
        ahead = run.draw(lambda: [self._order(run, size, device) for _ in range(self.n_epochs)]) \
            if self.target_kl is None and not self.steps_draw else None
        tally = None
        going: Runner | None = run
        for epoch in range(self.n_epochs):
            assert going is not None
            step = going
            order = ahead[epoch] if ahead is not None else step.draw(partial(self._order, step, size, device))
            kls = []
            for idx in order:
                minibatch = step.storage.env_batch(idx) if self.recurrent else step.take(batch, idx)
                # the auxiliary loss's draws, from the run's stream, where its loss would draw them
                noise = step.draw(partial(self.auxiliary_noise, minibatch)) if self.steps_draw else None
                _, stats = step(self.train_step, minibatch, clip, ent_coef, vf_coef, kl_coef, noise,
                                addon_coefs(self.policy_addons))
                tally = step.tally(tally, stats)
                kls.append(stats["approx_kl"])
            if self.target_kl is not None:
                going = step.only(goes_on, torch.stack(kls, -1))
                if going is None:
                    break
        return {**means(tally), **run.read(self.update_metrics, batch)}

    def _order(self, run: Runner, size: int, device: torch.device) -> list[torch.Tensor]:
        """One epoch's shuffled minibatches: of the rollout's steps, or of its envs for a recurrent actor."""
        if self.recurrent:
            return list(minibatches(run.storage.num_envs, self.batch_size // run.storage.n_steps, device))
        return list(minibatches(size, self.batch_size, device))

    def settings(self) -> tuple[float | None, float, float, float | None]:
        """This update's clip range and loss coefficients; the learning rate set as the schedule has it now."""
        set_lr(self.optimizer, self.lr_scale)
        clip = None if self.clip_range is None else self.clip_range * self.clip_range_scale
        return clip, self.ent_coef, self.vf_coef, self.kl_coef

    def update_metrics(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        values, returns = batch.values, batch.returns
        if values.dim() > 1:  # several value heads (rnd_ppo): report the extrinsic one
            values, returns = values[:, 0], returns[:, 0]
        metrics = {"explained_variance": explained_variance(values, returns, batch.mask),
                   "learning_rate": torch.tensor(self.optimizer.param_groups[0]["lr"])}
        if self.clip_range is not None:
            metrics["clip_range"] = torch.tensor(self.clip_range * self.clip_range_scale)
        if self.kl_coef is not None:
            metrics["kl_coef"] = torch.tensor(self.kl_coef)  # the coefficient this update used
        return metrics

    def finish_update(self, clock: RunClock, metrics: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The KL penalty's adaptation, after the update (each member's own, in a population)."""
        if self.kl_coef is not None:
            self.kl_coef = adapt_kl_coef(self.kl_coef, float(metrics["approx_kl"]), self.kl_target)
        return metrics

    def population_refusal(self) -> str | None:
        reasons = [(bool(self.extra_param_groups(1.0)), f"{type(self).__name__}'s extra networks")]
        own = next((what for bad, what in reasons if bad), None)
        return own or refuse_in_population(self.networks, self.policy_addons)

    def minibatch_loss(self, batch: RolloutBatch, clip: float | torch.Tensor | None,
                       ent_coef: float | torch.Tensor | None = None, vf_coef: float | torch.Tensor | None = None,
                       kl_coef: float | torch.Tensor | None = None, aux_noise: torch.Tensor | None = None,
                       addon_coefs: Sequence[Any] | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss of one minibatch and what to log (the coefficients default to the algorithm's own;
        `aux_noise`, `addon_coefs`: the auxiliary loss's draws and the add-ons' coefficients, which a compiled step
        takes as arguments)."""
        ent_coef = self.ent_coef if ent_coef is None else ent_coef
        vf_coef = self.vf_coef if vf_coef is None else vf_coef
        kl_coef = self.kl_coef if kl_coef is None else kl_coef
        mask = batch.mask
        log_probs, entropy, values = evaluate_batch(self.networks, batch)
        advantages = batch.advantages
        if self.normalize_advantage and advantages.numel() > 1:
            advantages = normalize_masked(advantages, mask)
        log_ratio = log_probs - batch.log_probs
        ratio = log_ratio.exp()
        policy_loss = clipped_surrogate_loss(advantages, ratio, clip, mask)
        kl = masked_mean(ratio - 1 - log_ratio, mask)  # KL(old || new), Schulman's low-variance estimator
        if kl_coef is not None:
            policy_loss = policy_loss + kl_coef * kl
        extra, addon_logs = addon_losses(self.policy_addons, self.networks, batch.obs, mask, addon_coefs)
        policy_loss = policy_loss + extra
        value_loss = squared_value_loss(values, batch.returns, mask, batch.values, self.clip_range_vf)
        entropy_mean = masked_mean(entropy, mask)
        aux_loss, aux_logs = self.auxiliary_loss(batch, aux_noise)
        loss = policy_loss - ent_coef * entropy_mean + vf_coef * value_loss + aux_loss
        stats = {
            "policy_loss": policy_loss.detach(), "value_loss": value_loss.detach(),
            "entropy": entropy_mean.detach(), "approx_kl": kl.detach(), "loss": loss.detach(), **addon_logs,
            **aux_logs,
        }
        if clip is not None:
            with torch.no_grad():
                stats["clip_fraction"] = masked_mean(((ratio - 1).abs() > clip).float(), mask)
        return loss, stats

    def extra_param_groups(self, lr: float) -> list[dict[str, Any]]:
        """Optimizer groups beyond the actor's (rnd_ppo's predictor); none for plain PPO."""
        return []

    def auxiliary_loss(self, batch: RolloutBatch, noise: torch.Tensor | None = None,
                       ) -> tuple[torch.Tensor | float, dict[str, torch.Tensor]]:
        """An extra loss trained in the same step (rnd_ppo's predictor); none for plain PPO. `noise`: its random
        draws (`auxiliary_noise`'s), or None to draw them itself."""
        return 0.0, {}

    def auxiliary_noise(self, batch: RolloutBatch) -> torch.Tensor | None:
        """The auxiliary loss's draws for one minibatch, from the run's stream (a compiled step's are drawn
        outside its graph, where the eager step draws them); None for plain PPO."""
        return None

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer]

    def trained_modules(self) -> torch.nn.Module:
        """The modules holding every parameter the optimizer steps (what a compiled step substitutes)."""
        return self.networks

    def env_actions(self, actions: torch.Tensor) -> torch.Tensor:
        return clipped_env_actions(self.networks, actions)

    def state_dict(self) -> dict[str, Any]:
        return {"networks": self.networks.state_dict(), "optimizer": self.optimizer.state_dict(),
                "kl_coef": self.kl_coef}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.networks.load_state_dict(state["networks"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.kl_coef = state.get("kl_coef", self.kl_coef)


@ALGOS.register("ppo_kl", spec=AlgoSpec(on_policy=True, action_spaces=ON_POLICY_ACTIONS, compiles=True,
                                        population="on_policy"))
class PPOKL(PPO):
    """PPO with the adaptive KL penalty instead of clipping (Schulman et al. 2017, section 4): PPO's machinery,
    with the penalty on and the clip off by default."""

    def __init__(
        self,
        networks: ActorCritic,
        num_envs: int,
        clip_range: float | None = None,  # no clipping: the KL penalty alone keeps updates small
        kl_coef: float | None = 1.0,  # initial KL penalty coefficient, adapted after every update
        **ppo_settings: Any,
    ) -> None:
        super().__init__(networks, num_envs, clip_range=clip_range, kl_coef=kl_coef, **ppo_settings)


def goes_on(algo: PPO, approx_kls: torch.Tensor) -> bool:
    """algo.target_kl: the update ends after an epoch whose minibatches' mean approximate KL passed 1.5 x the
    target (SB3's rule)."""
    return not approx_kls.mean().item() > 1.5 * algo.target_kl  # type: ignore[operator]


def adapt_kl_coef(coef: float, kl: float, target: float) -> float:
    """The PPO paper's rule, after each update: halve the penalty when the policy moved less than
    target / 1.5, double it when it moved more than 1.5 x target."""
    if kl < target / 1.5:
        return coef / 2
    if kl > target * 1.5:
        return coef * 2
    return coef
