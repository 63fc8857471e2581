"""On-policy rollout storage and GAE.

Layout is [n_steps, num_envs]. With NEXT_STEP autoreset a step that follows an episode's end is a
reset step: its action was ignored by the env, so it is stored with `valid = 0` and masked out of
every loss. That layout makes truncation bootstrapping free: the value stored at the reset step is
V(final observation), which is exactly what a time-limited step must bootstrap from.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from rlcli.batches import RolloutBatch
from rlcli.contracts import BufferSpec
from rlcli.registry import BUFFERS
from rlcli.schedules import Schedule


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    terminated: torch.Tensor,
    dones: torch.Tensor,
    last_values: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimates and returns over a [T, N] rollout.

    `values[t + 1]` (or `last_values` after the last step) is the value of the observation that
    step t returned. `terminated` zeroes that bootstrap; `dones` (terminated or truncated) stops
    the advantage from flowing across an episode boundary. A truncated step therefore bootstraps
    from V(final observation) and no further.
    """
    next_values = torch.cat([values[1:], last_values.unsqueeze(0)], 0)
    deltas = rewards + gamma * next_values * (1.0 - terminated) - values
    carry = gamma * gae_lambda * (1.0 - dones)
    advantages = torch.empty_like(rewards)
    running = torch.zeros_like(last_values)
    for t in range(rewards.shape[0] - 1, -1, -1):
        running = deltas[t] + carry[t] * running
        advantages[t] = running
    return advantages, advantages + values


def compute_gae_turns(
    rewards: torch.Tensor,
    values: torch.Tensor,
    terminated: torch.Tensor,
    dones: torch.Tensor,
    last_values: torch.Tensor,
    gamma: float,
    gae_lambda: float,
    acting: torch.Tensor,
    last_acting: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GAE for turn-based envs (envs/turn_based.py), where `acting[t]` says whether an env's row acts at the
    observation of step t; `last_acting`, at the observation after the last step.

    A row's transition goes from a step where it acts to the next one where it acts (or the end of its episode):
    the steps between, where it waits, are folded into it: their rewards are added to its reward undiscounted, and a
    termination or truncation among them is its own; the bootstrap is the value at that next acting step, one
    discount away. A waiting step gets advantage 0. Where a row's last acting step has no acting step after it in
    the rollout, its transition is unfinished (its reward and next turn lie in the next rollout): it gets advantage
    0 and `complete` 0, and the transition before it bootstraps from its value, as a rollout's last step does from
    `last_values`. Returns the advantages, the returns and `complete` (1 where a transition is whole).
    With every step acting this is `compute_gae`."""
    acting = acting.bool()
    advantages = torch.zeros_like(rewards)
    complete = torch.zeros_like(rewards)
    last = last_acting.bool()
    next_value = torch.where(last, last_values, torch.zeros_like(last_values))
    running = torch.zeros_like(last_values)
    whole = last.to(rewards.dtype)  # whether a decision point lies ahead in this rollout
    pending_reward = torch.zeros_like(last_values)
    pending_terminated = torch.zeros_like(last_values)
    pending_done = torch.zeros_like(last_values)
    for t in range(rewards.shape[0] - 1, -1, -1):
        reward = rewards[t] + pending_reward
        term = torch.maximum(terminated[t], pending_terminated)
        done = torch.maximum(dones[t], pending_done)
        delta = reward + gamma * next_value * (1.0 - term) - values[t]
        advantage = (delta + gamma * gae_lambda * (1.0 - done) * running) * whole
        here = acting[t]
        advantages[t] = torch.where(here, advantage, torch.zeros_like(advantage))
        complete[t] = torch.where(here, whole, torch.zeros_like(whole))
        # an acting step is the next decision point for the steps before it; a waiting one adds to what is pending
        running = torch.where(here, advantage, running)
        next_value = torch.where(here, values[t], next_value)
        whole = torch.where(here, torch.ones_like(whole), whole)
        pending_reward = torch.where(here, torch.zeros_like(reward), reward)
        pending_terminated = torch.where(here, torch.zeros_like(term), term)
        pending_done = torch.where(here, torch.zeros_like(done), done)
    return advantages, advantages + values, complete


HOST_FIELDS = ("rewards", "terminated", "dones", "valid")  # what the envs give as numpy arrays each step


@BUFFERS.register("rollout", spec=BufferSpec(on_policy=True))
class RolloutBuffer:
    """Preallocated [n_steps, num_envs] tensors on the training device."""

    def __init__(
        self,
        n_steps: int,
        num_envs: int,
        obs_shape: tuple[int, ...],
        action_shape: tuple[int, ...],
        discrete: bool,
        device: torch.device,
        carry_size: int = 0,
        value_size: int = 1,
        obs_dtype: torch.dtype = torch.float32,
        mask_size: int = 0,
        **_unused_context: object,
    ) -> None:
        self.n_steps, self.num_envs, self.device = n_steps, num_envs, device
        self.carry_size = carry_size
        self.default_schedules: dict[str, Schedule] = {}
        shape = (n_steps, num_envs)

        def zeros(*extra: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.zeros(*shape, *extra, dtype=dtype, device=device)

        self.obs = zeros(*obs_shape, dtype=obs_dtype)  # uint8 for pixels (actor=cnn)
        self.actions = zeros(*action_shape, dtype=torch.long if discrete else torch.float32)
        self.log_probs = zeros()
        self.values = zeros() if value_size == 1 else zeros(value_size)  # rnd_ppo: [extrinsic, intrinsic]
        self.rewards = zeros()
        self.terminated = zeros()
        self.dones = zeros()
        self.valid = zeros()
        self.advantages = zeros()
        self.returns = zeros()
        self.starts = zeros() if carry_size else None  # recurrent actors: episode starts and carries
        self.carries = zeros(carry_size) if carry_size else None
        # the valid actions at each step, for algorithms that act on masks (mask_size = number of actions)
        self.action_masks = zeros(mask_size, dtype=torch.bool) if mask_size else None
        # turn-based envs (envs/turn_based.py): whether each row acts at each step's observation, and at the
        # observation after the last step (set by the collector before the returns); None where the env does not say
        self.acting: torch.Tensor | None = None
        self.last_acting: torch.Tensor | None = None
        self._zeros = zeros
        # on a CPU the env's per-step arrays are stored through numpy views of their tensors: a numpy store each,
        # where converting to a tensor and storing that took ~5 us a field, every step of every run
        self._on_cpu = torch.device(device).type == "cpu"
        self.pos = 0

    def add(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor,
        log_probs: torch.Tensor,
        values: torch.Tensor,
        rewards: torch.Tensor | np.ndarray,
        terminated: torch.Tensor | np.ndarray,
        dones: torch.Tensor | np.ndarray,
        valid: torch.Tensor | np.ndarray,
        starts: torch.Tensor | None = None,
        carry: torch.Tensor | None = None,
        action_mask: torch.Tensor | None = None,
        acting: np.ndarray | None = None,
    ) -> None:
        """One step of every env; `rewards` ... `valid` as the envs gave them (numpy) or as tensors. `acting`: a
        turn-based env's rows that act at `obs` (compute_gae_turns)."""
        t = self.pos
        if acting is not None:
            if self.acting is None:
                self.acting = self._zeros(dtype=torch.bool)
            self.acting[t] = torch.as_tensor(acting, dtype=torch.bool, device=self.device)
        if self.action_masks is not None:
            self.action_masks[t] = action_mask
        if self.carries is not None:
            self.starts[t] = starts
            self.carries[t] = carry
        self.obs[t] = obs
        self.actions[t] = actions
        self.log_probs[t] = log_probs
        self.values[t] = values
        for name, value in zip(HOST_FIELDS, (rewards, terminated, dones, valid), strict=True):
            if self._on_cpu and isinstance(value, np.ndarray):
                getattr(self, name).numpy()[t] = value
            else:
                getattr(self, name)[t] = torch.as_tensor(value, dtype=torch.float32, device=self.device)
        self.pos += 1

    @property
    def full(self) -> bool:
        return self.pos == self.n_steps

    def compute_returns(self, last_values: torch.Tensor, gamma: float, gae_lambda: float) -> None:
        if self.acting is not None:  # a turn-based env: waiting steps folded in, unfinished transitions left out
            if self.last_acting is None:  # counting every row as acting would bootstrap waiting rows' moves wrongly
                raise RuntimeError("a turn-based rollout's returns need last_acting (the rows that act at the "
                                   "observations it ends on), which the collector's end() sets")
            self.advantages, self.returns, complete = compute_gae_turns(
                self.rewards, self.values, self.terminated, self.dones, last_values, gamma, gae_lambda,
                self.acting, self.last_acting)
            self.valid *= complete
            return
        self.advantages, self.returns = compute_gae(
            self.rewards, self.values, self.terminated, self.dones, last_values, gamma, gae_lambda
        )

    def flat(self) -> RolloutBatch:
        """The whole rollout as [n_steps * num_envs, ...] tensors."""

        def f(x: torch.Tensor) -> torch.Tensor:
            return x.reshape(-1, *x.shape[2:])

        return RolloutBatch(
            f(self.obs), f(self.actions), f(self.log_probs), f(self.values),
            f(self.advantages), f(self.returns), f(self.valid),
            self.starts, None if self.carries is None else self.carries[0],
            None if self.action_masks is None else f(self.action_masks),
        )

    def env_batch(self, envs: torch.Tensor) -> RolloutBatch:
        """Whole sequences of some envs (recurrent minibatches never cut an env's rollout)."""

        def f(x: torch.Tensor) -> torch.Tensor:
            return x[:, envs].reshape(-1, *x.shape[2:])

        return RolloutBatch(
            f(self.obs), f(self.actions), f(self.log_probs), f(self.values),
            f(self.advantages), f(self.returns), f(self.valid), self.starts[:, envs], self.carries[0, envs],
            None if self.action_masks is None else f(self.action_masks),
        )

    def columns(self, envs: torch.Tensor) -> RolloutBuffer:
        """A full rollout's columns `envs` as a rollout of their own (copies: returns computed on it stay in it),
        for a learner of some of the rows (algo.groups: each group's algorithm learns from its agents' rows)."""
        if self.acting is not None:
            raise RuntimeError("a turn-based rollout has no columns of its own")
        part = copy.copy(self)
        layout = (self.n_steps, self.num_envs)
        for name, value in vars(self).items():
            if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[:2] == layout:
                setattr(part, name, value[:, envs])
        part.num_envs = int(envs.numel())
        return part

    def reset(self) -> None:
        self.pos = 0

    def state_dict(self) -> dict[str, object]:
        names = ("obs", "actions", "log_probs", "values", "rewards", "terminated", "dones", "valid")
        names += ("starts", "carries") if self.carries is not None else ()
        names += ("action_masks",) if self.action_masks is not None else ()
        names += ("acting",) if self.acting is not None else ()
        return {"pos": self.pos} | {n: getattr(self, n).clone() for n in names}

    def load_state_dict(self, state: dict[str, object]) -> None:
        for name, value in state.items():
            if name == "pos":
                self.pos = int(value)  # type: ignore[arg-type]
            elif name == "acting" and self.acting is None:
                self.acting = self._zeros(dtype=torch.bool)
                self.acting.copy_(value)  # type: ignore[arg-type]
            else:
                getattr(self, name).copy_(value)  # type: ignore[arg-type]
