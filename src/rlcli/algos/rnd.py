"""PPO with Random Network Distillation (`rnd_ppo`), Burda et al. 2018, "Exploration by Random
Network Distillation".

A fixed, randomly initialized *target* network embeds each observation; a *predictor* network is
trained to match it. The predictor's error is small on states seen often and large on new ones, so
it is an exploration bonus (the intrinsic reward). Following the paper:

- observations are whitened by RND's own running mean/std and clipped to [-5, 5] before both
  networks; `obs_norm_warmup_steps` env steps at the start only gather those statistics (nothing
  learns while they are collected; they count toward train.total_steps);
- intrinsic rewards are divided by a running std of their discounted sum (computed forward in time
  per env, `discounted_forward_filter`), so their scale stays steady as the predictor learns;
- the intrinsic stream is non-episodic (an episode end does not cut its returns) with its own
  discount `int_gamma` and its own value head; advantages are `ext_coef * A_ext + int_coef * A_int`;
- the predictor trains on a random `update_proportion` of each minibatch, in the same optimizer step.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from rlcli.actors.layers import mlp, orthogonal_init
from rlcli.actors.mlp import ActorCritic
from rlcli.actors.normalizer import RunningNorm
from rlcli.algos.ppo import PPO
from rlcli.batches import RolloutBatch
from rlcli.buffers.rollout import compute_gae
from rlcli.contracts import AlgoSpec, RecurrentState, RolloutStorage, RunClock
from rlcli.registry import ALGOS, ConfigError, require


class RandomNetworkDistillation(nn.Module):
    """Target and predictor networks with the observation statistics that feed them."""

    def __init__(self, obs_dim: int, hidden_sizes: list[int], features: int) -> None:
        super().__init__()
        width = hidden_sizes[-1] if hidden_sizes else obs_dim
        self.obs_norm = RunningNorm((obs_dim,), clip=5.0)
        self.target = nn.Sequential(mlp(obs_dim, hidden_sizes, "leaky_relu"), nn.Linear(width, features))
        # The predictor is a little deeper than the target, as in the paper, so it can fit it.
        self.predictor = nn.Sequential(mlp(obs_dim, hidden_sizes, "leaky_relu"), nn.Linear(width, width),
                                       nn.ReLU(), nn.Linear(width, features))
        orthogonal_init(self, math.sqrt(2))
        self.target.requires_grad_(False)

    def errors(self, obs: torch.Tensor) -> torch.Tensor:
        """Per-observation prediction error ||predictor(x) - target(x)||^2 / 2, x = RND-normalized obs."""
        x = self.obs_norm(obs)
        return (self.predictor(x) - self.target(x)).square().sum(-1) / 2


def discounted_forward_filter(rewards: torch.Tensor, running: torch.Tensor, gamma: float) -> torch.Tensor:
    """The discounted sum of rewards so far, per env: out[t] = gamma * out[t-1] + r[t], starting from
    `running` (updated in place). Its spread is what intrinsic rewards are divided by."""
    out = torch.empty_like(rewards)
    for t in range(rewards.shape[0]):
        running.mul_(gamma).add_(rewards[t])
        out[t] = running
    return out


def check_flat_observations(space: gym.spaces.Space, env_id: str) -> None:
    """RND keeps a running mean/std per observation entry: it needs a flat Box observation."""
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
        raise ConfigError(f"algo=rnd_ppo normalizes observations entry by entry and needs a flat Box observation; "
                          f"{env_id} has {space}")


@ALGOS.register("rnd_ppo", spec=AlgoSpec(on_policy=True, networks=("mlp",), value_outputs=2, compiles=True,
                                          check_observations=check_flat_observations, rollout_returns=False))
class RNDPPO(PPO):
    """PPO whose network has two value heads (extrinsic, intrinsic) plus the RND bonus; see the module doc."""

    def __init__(
        self,
        networks: ActorCritic,
        num_envs: int,
        int_gamma: float = 0.99,  # intrinsic discount; the intrinsic stream ignores episode ends
        ext_coef: float = 2.0,  # advantages = ext_coef * A_extrinsic + int_coef * A_intrinsic
        int_coef: float = 1.0,
        update_proportion: float = 0.25,  # share of each minibatch the predictor trains on
        obs_norm_warmup_steps: int = 2048,  # env steps at the start that only gather RND's observation statistics
        rnd_hidden_sizes: list[int] = (64, 64),  # type: ignore[assignment]  # target and predictor bodies (the
                                                                             # predictor has one more layer)
        rnd_features: int = 64,  # size of the embedding the predictor learns to match
        n_steps: int = 128,  # env steps per env between updates
        batch_size: int = 256,  # minibatch size
        n_epochs: int = 4,
        gamma: float = 0.999,  # extrinsic discount (the paper's)
        ent_coef: float = 0.001,
        **ppo_settings: Any,
    ) -> None:
        """PPO's settings where RND's paper (and conf/algo/rnd_ppo.yaml) differ; the rest as PPO's."""
        ppo_settings.update(n_steps=n_steps, batch_size=batch_size, n_epochs=n_epochs, gamma=gamma, ent_coef=ent_coef)
        require(0 <= int_gamma <= 1, "algo.int_gamma", int_gamma, "must be in [0, 1]")
        require(ext_coef >= 0, "algo.ext_coef", ext_coef, "must be >= 0")
        require(int_coef >= 0, "algo.int_coef", int_coef, "must be >= 0")
        require(0 < update_proportion <= 1, "algo.update_proportion", update_proportion, "must be in (0, 1]")
        require(obs_norm_warmup_steps >= 0, "algo.obs_norm_warmup_steps", obs_norm_warmup_steps, "must be >= 0")
        require(rnd_features > 0 and all(h > 0 for h in rnd_hidden_sizes), "algo.rnd_hidden_sizes",
                list(rnd_hidden_sizes), "sizes (and algo.rnd_features) must be > 0")
        self.int_gamma, self.ext_coef, self.int_coef = int_gamma, ext_coef, int_coef
        self.update_proportion, self.obs_norm_warmup_steps = update_proportion, obs_norm_warmup_steps
        device = next(networks.parameters()).device
        # built before PPO's optimizer, which takes the predictor through `extra_param_groups`
        self.rnd = RandomNetworkDistillation(int(networks.obs_shape[0]), list(rnd_hidden_sizes),
                                             rnd_features).to(device)
        super().__init__(networks, num_envs, **ppo_settings)
        self.schedulable = (*self.schedulable, "int_gamma", "ext_coef", "int_coef", "update_proportion")
        self.int_reward_norm = RunningNorm(()).to(device)  # statistics of the discounted intrinsic sums
        self.int_running = torch.zeros(num_envs, device=device)
        self.warmup_seen = 0  # env steps whose observations only fed RND's statistics
        self.warming_up = False  # the rollout just collected was a warm-up one
        self.last_int_rewards: torch.Tensor | None = None

    def extra_param_groups(self, lr: float) -> list[dict[str, Any]]:
        return [{"params": list(self.rnd.predictor.parameters()), "lr": lr, "base_lr": lr, "name": "rnd"}]

    def trained_modules(self) -> nn.Module:
        return nn.ModuleDict({"actor_critic": self.networks, "rnd": self.rnd})

    @torch.inference_mode()
    def finish_rollout(self, buffer: RolloutStorage, last_obs: torch.Tensor, state: RecurrentState | None) -> None:
        """Intrinsic rewards for the rollout's steps, then both GAEs and the combined advantages."""
        steps = buffer.n_steps * buffer.num_envs
        next_obs = torch.cat([buffer.obs[1:], last_obs.unsqueeze(0)], 0)  # what each step led to
        self.warming_up = self.warmup_seen < self.obs_norm_warmup_steps
        if self.warming_up:
            int_rewards = torch.zeros_like(buffer.rewards)
            self.warmup_seen += steps
        else:
            int_rewards = self.rnd.errors(next_obs) * buffer.valid  # reset steps are not transitions
            filtered = discounted_forward_filter(int_rewards, self.int_running, self.int_gamma)
            self.int_reward_norm.update(filtered)
            self.last_int_rewards = int_rewards.mean()
            int_rewards = int_rewards / (self.int_reward_norm.var.sqrt().float() + 1e-8)
        self.rnd.obs_norm.update(next_obs.reshape(steps, -1))  # after the rewards, as in the paper
        last_values = self.networks.value(last_obs)
        adv_ext, ret_ext = compute_gae(buffer.rewards, buffer.values[..., 0], buffer.terminated, buffer.dones,
                                       last_values[:, 0], self.gamma, self.gae_lambda)
        never = torch.zeros_like(buffer.rewards)  # non-episodic: episode ends do not cut intrinsic returns
        adv_int, ret_int = compute_gae(int_rewards, buffer.values[..., 1], never, never, last_values[:, 1],
                                       self.int_gamma, self.gae_lambda)
        buffer.advantages = self.ext_coef * adv_ext + self.int_coef * adv_int
        buffer.returns = torch.stack([ret_ext, ret_int], -1)

    def update(self, buffer: RolloutStorage, clock: RunClock) -> dict[str, torch.Tensor]:
        if self.warming_up:
            return {"rnd_warmup_steps": torch.tensor(float(self.warmup_seen))}
        metrics = super().update(buffer, clock)
        if self.last_int_rewards is not None:
            metrics["intrinsic_reward"] = self.last_int_rewards
        return metrics

    def auxiliary_loss(self, batch: RolloutBatch, noise: torch.Tensor | None = None,
                       ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The predictor's distillation loss on a random `update_proportion` of the minibatch."""
        errors = self.rnd.errors(batch.obs)
        noise = self.auxiliary_noise(batch) if noise is None else noise
        keep = (noise < self.update_proportion).float() * batch.mask
        loss = (errors * keep).sum() / keep.sum().clamp_min(1.0)
        return loss, {"rnd_loss": loss.detach()}

    def auxiliary_noise(self, batch: RolloutBatch) -> torch.Tensor:
        """Which of the minibatch's steps the predictor trains on is drawn as uniforms here."""
        return torch.rand(batch.mask.shape, device=batch.mask.device)

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {
            "rnd": self.rnd.state_dict(), "int_reward_norm": self.int_reward_norm.state_dict(),
            "int_running": self.int_running.clone(), "warmup_seen": self.warmup_seen, "warming_up": self.warming_up,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.rnd.load_state_dict(state["rnd"])
        self.int_reward_norm.load_state_dict(state["int_reward_norm"])
        self.int_running.copy_(state["int_running"])
        self.warmup_seen, self.warming_up = int(state["warmup_seen"]), bool(state["warming_up"])
