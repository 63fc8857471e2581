"""Deep Q-Network (Mnih et al. 2015) with double Q-learning and dueling heads as options."""

from __future__ import annotations

import copy
from typing import Any, Literal

import gymnasium as gym
import torch
from torch import nn

from rlcli.actors.offpolicy import NetworkRecipe, QNetwork
from rlcli.actors.recurrent import RecurrentQNetwork, RecurrentRecipe, state_or_zeros
from rlcli.algos.base import adam
from rlcli.algos.exploration import epsilon_greedy
from rlcli.algos.loss_step import LossStep
from rlcli.algos.offpolicy import (
    StepOutput,
    TrainFreqUnit,
    check_offpolicy,
    collect_phase,
    polyak_update,
    resolve_gradient_steps,
)
from rlcli.algos.runner import Runner, single_run_update
from rlcli.batches import SequenceBatch
from rlcli.contracts import ActOutput, AlgoSpec, RecurrentState, ReplayStorage, RunClock, SequenceStorage
from rlcli.registry import ALGOS, require
from rlcli.schedules import Schedule


def q_learning_target(rewards: torch.Tensor, discounts: torch.Tensor, next_q_target: torch.Tensor,
                      next_q_online: torch.Tensor | None, reward_scale: float) -> torch.Tensor:
    """r + discount * Q_target(s', a*), with a* greedy in the target net, or (double Q-learning) in the online
    net. Transitions and stored sequences (R2D2) alike: the last axis is the actions."""
    if next_q_online is not None:  # the online net picks the action, the target net values it
        next_value = next_q_target.gather(-1, next_q_online.argmax(-1, keepdim=True)).squeeze(-1)
    else:
        next_value = next_q_target.max(-1).values
    return reward_scale * rewards + discounts * next_value


def q_regression_loss(q: torch.Tensor, target: torch.Tensor, loss: str) -> torch.Tensor:
    """Each element's loss toward its target: Huber (smooth L1, SB3's default) or squared error."""
    if loss == "huber":
        return nn.functional.smooth_l1_loss(q, target, reduction="none")
    return (q - target).square()


class DQNNetworks(nn.Module):
    def __init__(self, torso: NetworkRecipe, n_actions: int, dueling: bool, outputs_per_action: int = 1):
        super().__init__()
        self.normalizer = torso.normalizer
        self.q = QNetwork(torso, n_actions * outputs_per_action, dueling)  # QR-DQN: quantiles per action
        self.q_target = copy.deepcopy(self.q).requires_grad_(False)


class RecurrentDQNNetworks(nn.Module):
    """R2D2's networks. Like the recurrent actor-critics, acting takes the carry and episode starts
    and returns the next carry."""

    def __init__(self, torso: RecurrentRecipe, n_actions: int):
        super().__init__()
        self.normalizer = torso.normalizer
        self.carry_size = torso.carry_size
        self.q = RecurrentQNetwork(torso, n_actions)
        self.q_target = copy.deepcopy(self.q).requires_grad_(False)

    def initial_carry(self, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.zeros(n, self.carry_size, device=device)

    def q_values(self, obs: torch.Tensor, state: RecurrentState | None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q.step(obs, *state_or_zeros(state, obs, self.carry_size))


@ALGOS.register("dqn", spec=AlgoSpec(on_policy=False, action_spaces=("Discrete",), compiles=True,
                                     population="lockstep"))
class DQN:
    def __init__(
        self,
        recipe: NetworkRecipe | RecurrentRecipe,
        action_space: gym.spaces.Space,
        num_envs: int,
        lr: float = 1e-4,
        batch_size: int = 32,
        learning_starts: int = 100,  # env steps of random actions before the first update
        train_freq: int = 4,  # env steps per env between update phases
        train_freq_unit: TrainFreqUnit = "step",  # step | episode (a collect phase lasts until train_freq episodes end,
                                                  # SB3's (n, "episode"))
        gradient_steps: int = 1,  # gradient steps per update phase
        gamma: float = 0.99,
        tau: float = 1.0,  # target update weight: 1 = hard copy, <1 = Polyak averaging
        target_update_interval: int = 1000,  # steps between target updates, of the unit target_update_unit names
        target_update_unit: Literal["env_step", "gradient_step"] = "env_step",  # env_step (SB3's: at the end of the
                                # update phase that crosses a multiple) | gradient_step (after every interval-th
                                # gradient step: tau=0.005 with interval 1 is BenchMARL's and torchrl's soft update)
        exploration_fraction: float = 0.1,  # fraction of train.total_steps over which epsilon decays
        exploration_initial_eps: float = 1.0,
        exploration_final_eps: float = 0.05,
        loss: Literal["huber", "mse"] = "huber",  # huber | mse (the TD loss)
        double: bool = False,  # double Q-learning targets (the online net picks the next action)
        dueling: bool = False,  # dueling value/advantage heads
        max_grad_norm: float | None = 10.0,
        reward_scale: float = 1.0,  # rewards are multiplied by it in the targets
    ) -> None:
        check_offpolicy(lr, batch_size, learning_starts, train_freq, gradient_steps, gamma, tau, reward_scale)
        require(target_update_interval > 0, "algo.target_update_interval", target_update_interval, "must be > 0")
        require(target_update_unit in ("env_step", "gradient_step"), "algo.target_update_unit", target_update_unit,
                "choose from: env_step, gradient_step")
        require(0 <= exploration_fraction <= 1, "algo.exploration_fraction", exploration_fraction, "must be in [0, 1]")
        for key, eps in (("algo.exploration_initial_eps", exploration_initial_eps),
                         ("algo.exploration_final_eps", exploration_final_eps)):
            require(0 <= eps <= 1, key, eps, "must be in [0, 1]")
        self.n_actions = int(action_space.n)
        self.recurrent = isinstance(recipe, RecurrentRecipe)
        require(not (self.recurrent and dueling), "algo.dueling", dueling, "is not built for recurrent Q-networks")
        self.networks: DQNNetworks | RecurrentDQNNetworks = (
            RecurrentDQNNetworks(recipe, self.n_actions) if isinstance(recipe, RecurrentRecipe)
            else DQNNetworks(recipe, self.n_actions, dueling, self.outputs_per_action()))
        self.optimizer = adam(self.networks.q.parameters(), lr=lr)
        self.steps_per_collect, self.episodes_per_collect = collect_phase(train_freq, train_freq_unit)
        self.batch_size, self.learning_starts = batch_size, learning_starts
        self.gradient_steps = resolve_gradient_steps(gradient_steps, train_freq, num_envs, train_freq_unit)
        self.gamma, self.tau, self.target_update_interval = gamma, tau, target_update_interval
        self.target_update_unit = target_update_unit
        # epsilon over the run: a schedule the trainer applies before each collect phase
        self.epsilon = exploration_initial_eps
        self.default_schedules = {"epsilon": Schedule("linear", exploration_initial_eps, exploration_final_eps,
                                                      exploration_fraction)}
        self.loss, self.double, self.max_grad_norm, self.reward_scale = loss, double, max_grad_norm, reward_scale
        self.gradient_updates = 0
        self.last_target_update = 0  # env steps at the last target update
        self.schedulable: tuple[str, ...] = ("epsilon", "gamma", "tau", "max_grad_norm", "reward_scale")
        # what a population's members may differ in beside seed, lr, tau and max_grad_norm: each acts with its own
        # epsilon and updates its own target network (finish_update) (sweeps/population/lockstep.py)
        self.member_settings = {"epsilon": "exploration_*", "target_update_interval": "target_update_interval",
                                "last_target_update": "target_update_interval"}
        # one gradient step on a batch of transitions, or of stored sequences (R2D2) for a recurrent network
        self.train_step = LossStep(self.networks, self.optimizer,
                                   self._sequence_loss if self.recurrent else self.transition_loss, clip_of=self)

    def outputs_per_action(self) -> int:
        """What the Q-network predicts per action: one value (QR-DQN: its quantiles)."""
        return 1

    def q_values(self, obs: torch.Tensor, target: bool = False) -> torch.Tensor:
        """[B, actions] Q-values of the online (or target) network."""
        return (self.networks.q_target if target else self.networks.q)(obs)

    @torch.inference_mode()
    def act(self, obs: torch.Tensor, deterministic: bool = False, state: RecurrentState | None = None) -> ActOutput:
        carry = None
        if isinstance(self.networks, RecurrentDQNNetworks):
            q, carry = self.networks.q_values(obs, state)
        else:
            q = self.q_values(obs)
        return self.act_on(q, deterministic=deterministic, carry=carry)

    def act_on(self, q: torch.Tensor, values: torch.Tensor | None = None, deterministic: bool = False,
               carry: torch.Tensor | None = None) -> ActOutput:
        """Acting after the network: the greedy action, or epsilon-greedy (`values`: the on-policy family's slot of
        this signature, unused here)."""
        actions = q.argmax(-1)
        if not deterministic:
            actions = epsilon_greedy(actions, self.n_actions, self.epsilon)
        zeros = torch.zeros(actions.shape, device=actions.device)
        return ActOutput(actions, zeros, zeros, carry)

    def random_actions(self, n: int) -> torch.Tensor:
        return torch.randint(0, self.n_actions, (n,))

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer]

    def env_actions(self, actions: torch.Tensor) -> torch.Tensor:
        return actions

    def update(self, buffer: ReplayStorage | SequenceStorage, clock: RunClock) -> dict[str, torch.Tensor]:
        return single_run_update(self, buffer, clock)

    def finish_update(self, clock: RunClock, metrics: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """After an update phase's gradient steps (each member's own, in a population): the target network at its
        interval, and the phase's metrics."""
        net = self.networks
        # As in SB3 (and so RL-Zoo's tuned values): the interval counts env steps, not gradient steps (unless
        # target_update_unit=gradient_step: then _gradient_step updates it).
        if self.target_update_unit == "env_step" and clock.env_steps // self.target_update_interval \
                > self.last_target_update // self.target_update_interval:
            polyak_update(net.q_target, net.q, self.tau)
            self.last_target_update = clock.env_steps
        if not metrics:
            return {}
        return {**metrics, "epsilon": torch.tensor(self.epsilon),  # at this update's env step
                "learning_rate": torch.tensor(self.optimizer.param_groups[0]["lr"])}

    def _gradient_step(self, batch: Any, run: Runner) -> StepOutput:
        """One gradient step on a batch of transitions (or of stored sequences, for a recurrent network); written for
        a runner (algos/runner.py)."""
        loss, (errors, q_mean) = run(self.train_step, batch)
        self.gradient_updates += 1
        updates = self.gradient_updates
        # target_update_unit=gradient_step: the target network after every interval-th gradient step (each member's
        # own settings, in a population; env_step: finish_update)
        if (due := run.only(lambda algo: algo.target_update_unit == "gradient_step"
                            and updates % algo.target_update_interval == 0)) is not None:
            due.polyak(self.networks.q_target, self.networks.q)
        return (None if self.recurrent else errors), {"value_loss": loss.detach(), "q_mean": q_mean}

    def population_refusal(self) -> str | None:
        """What keeps this DQN out of a batched population (sweeps/population/lockstep.py), or None."""
        return "a recurrent Q-network (actor=gru/lstm)" if self.recurrent else None

    def transition_loss(self, batch: Any) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The (double) Q-learning loss on a batch of transitions, with each one's TD error (PER priorities) and
        the mean Q of the actions taken."""
        net = self.networks
        with torch.no_grad():
            target = q_learning_target(batch.rewards, batch.discounts, net.q_target(batch.next_obs),
                                       net.q(batch.next_obs) if self.double else None, self.reward_scale)
        q = net.q(batch.obs).gather(-1, batch.actions.long().unsqueeze(-1)).squeeze(-1)
        per_sample = q_regression_loss(q, target, self.loss)
        return (batch.weights * per_sample).mean(), ((q - target).detach(), q.detach().mean())

    def _sequence_loss(self, batch: SequenceBatch) -> tuple[torch.Tensor, tuple[tuple[()], torch.Tensor]]:
        """R2D2: refresh the stored state over the burn-in steps (no gradients), then 1-step Q-learning on
        the rest of the sequence, the target network unrolled over the whole sequence from the stored state (no
        TD errors: stored sequences keep no priorities)."""
        net, obs, burn = self.networks, batch.obs, batch.burn_in
        with torch.no_grad():
            target_q, _ = net.q_target.unroll(obs, batch.starts, batch.carry0)  # [L + 1, B, A]
            carry = batch.carry0
            if burn > 0:
                _, carry = net.q.unroll(obs[:burn], batch.starts[:burn], carry)
        q, _ = net.q.unroll(obs[burn:], batch.starts[burn:], carry)  # [L + 1 - burn, B, A]
        taken = q[:-1].gather(-1, batch.actions[burn:].unsqueeze(-1)).squeeze(-1)
        with torch.no_grad():
            target = q_learning_target(batch.rewards[burn:], self.gamma * (1.0 - batch.terminated[burn:]),
                                       target_q[burn + 1:], q[1:] if self.double else None, self.reward_scale)
        per_step = q_regression_loss(taken, target, self.loss)
        valid = batch.valid[burn:]
        loss = (per_step * valid).sum() / valid.sum().clamp_min(1.0)
        return loss, ((), (taken.detach() * valid).sum() / valid.sum().clamp_min(1.0))

    def state_dict(self) -> dict[str, Any]:
        return {"networks": self.networks.state_dict(), "optimizer": self.optimizer.state_dict(),
                "gradient_updates": self.gradient_updates, "last_target_update": self.last_target_update}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.networks.load_state_dict(state["networks"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.gradient_updates, self.last_target_update = state["gradient_updates"], state["last_target_update"]
