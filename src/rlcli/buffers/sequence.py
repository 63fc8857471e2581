"""Replay of fixed-length sequences for recurrent off-policy agents (`buffer=sequence`, R2D2).

Kapturowski et al. 2019 ("Recurrent Experience Replay in Distributed RL"): store sequences of
`burn_in + seq_len` steps with the recurrent state the actor had when the sequence began; when
learning, unroll the first `burn_in` steps without gradients to refresh that (stale) state, then
learn on the remaining `seq_len` steps. Consecutive sequences of one env overlap by
`sequence_overlap` (0 = back to back, 0.5 = each step appears in two sequences).

Sequences run across episode boundaries, as rollouts do for the recurrent on-policy actors: a
`starts` flag zeroes the state where an episode begins, and the reset step that follows an
episode's end (NEXT_STEP autoreset) is stored with `valid = 0` and never learned from. Each
sequence holds one more observation than steps, so the last step has its next observation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rlcli.batches import SequenceBatch
from rlcli.buffers.replay import identity, pending_on
from rlcli.contracts import BufferSpec
from rlcli.registry import BUFFERS, ConfigError, require
from rlcli.schedules import Schedule


class SequenceReplayBuffer:

    def __init__(self, capacity: int, seq_len: int, burn_in: int, sequence_overlap: float, num_envs: int,
                 obs_shape: tuple[int, ...], carry_size: int, device: torch.device,
                 obs_dtype: torch.dtype = torch.float32, action_shape: tuple[int, ...] = (),
                 discrete: bool = True, normalizer: Callable[[torch.Tensor], torch.Tensor] = identity) -> None:
        require(seq_len > 0, "buffer.seq_len", seq_len, "must be > 0")
        require(burn_in >= 0, "buffer.burn_in", burn_in, "must be >= 0")
        require(0 <= sequence_overlap < 1, "buffer.sequence_overlap", sequence_overlap, "must be in [0, 1)")
        self.length = burn_in + seq_len
        require(capacity >= self.length, "buffer.capacity", capacity,
                f"must hold at least one sequence of burn_in + seq_len = {self.length} steps")
        self.seq_len, self.burn_in, self.sequence_overlap = seq_len, burn_in, sequence_overlap
        self.stride = max(1, round(self.length * (1 - sequence_overlap)))  # steps between sequence starts
        self.capacity = capacity // self.length  # in sequences
        self.num_envs, self.device, self.normalizer = num_envs, device, normalizer
        self.default_schedules: dict[str, Schedule] = {}
        n, steps = self.capacity, self.length
        self.obs = torch.empty(n, steps + 1, *obs_shape, dtype=obs_dtype)  # committed as sequences arrive
        self.actions = torch.zeros(n, steps, *action_shape, dtype=torch.long if discrete else torch.float32)
        self.rewards = torch.zeros(n, steps)
        self.terminated = torch.zeros(n, steps)
        self.valid = torch.zeros(n, steps)
        self.starts = torch.zeros(n, steps + 1)
        self.carry0 = torch.zeros(n, carry_size)
        self.pos = self.size = 0
        # per env, the steps not yet in a full sequence: (obs, action, reward, terminated, valid, start, carry)
        self.pending: list[list[tuple[Any, ...]]] = [[] for _ in range(num_envs)]

    def __len__(self) -> int:
        return self.size

    def add(self, obs: torch.Tensor, actions: torch.Tensor, rewards: np.ndarray, next_obs: np.ndarray,
            terminated: np.ndarray, dones: np.ndarray, valid: np.ndarray, starts: torch.Tensor,
            carry: torch.Tensor) -> None:
        """One vector-env step, reset steps included (they keep the time axis whole)."""
        obs, actions, starts, carry = obs.cpu(), actions.cpu(), starts.cpu(), carry.cpu()
        for i in range(self.num_envs):
            pending = self.pending[i]
            pending.append((obs[i], actions[i], float(rewards[i]), float(terminated[i]), float(valid[i]),
                            float(starts[i]), carry[i]))
            if len(pending) == self.length:
                # the step after this one starts an episode exactly when this one is a reset step
                self._write(pending, torch.as_tensor(next_obs[i]), 1.0 - float(valid[i]))
                del pending[: self.stride]

    def envs_reset(self, rows: list[int]) -> None:
        """These envs were reset in mid-episode (a resume that could not restore them, a restarted Ray worker): the
        last step each stored has no next observation in its sequence (the next step is a new episode's first), so
        it is marked as not learned from, as a reset step is."""
        for i in rows:
            if self.pending[i]:
                last = self.pending[i][-1]
                self.pending[i][-1] = (*last[:4], 0.0, *last[5:])

    def _write(self, steps: list[tuple[Any, ...]], last_obs: torch.Tensor, last_start: float) -> None:
        o, a, r, term, val, st, carries = zip(*steps, strict=True)
        k = self.pos
        self.obs[k] = torch.stack([*o, last_obs.to(self.obs.dtype)])
        self.actions[k] = torch.stack(a)
        self.rewards[k] = torch.tensor(r)
        self.terminated[k] = torch.tensor(term)
        self.valid[k] = torch.tensor(val)
        self.starts[k] = torch.tensor([*st, last_start])
        self.carry0[k] = carries[0]
        self.pos = (self.pos + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def update_priorities(self, indices: torch.Tensor, td_errors: torch.Tensor) -> None:
        """Uniform sampling keeps no priorities: nothing to update (buffer=per overrides this)."""

    def sample(self, batch_size: int, step: int = 0, steps: int = 1) -> SequenceBatch:
        idx = torch.randint(0, self.size, (batch_size,))  # torch's CPU generator: resume draws the same

        def move(x: torch.Tensor) -> torch.Tensor:
            return x[idx].transpose(0, 1).contiguous().to(self.device, non_blocking=True)

        return SequenceBatch(self.normalizer(move(self.obs)), move(self.actions), move(self.rewards),
                             move(self.terminated), move(self.valid), move(self.starts),
                             self.carry0[idx].to(self.device), self.burn_in)

    def state_dict(self) -> dict[str, Any]:
        n = self.size
        names = ("obs", "actions", "rewards", "terminated", "valid", "starts", "carry0")
        return {"pos": self.pos, "size": n, "pending": self.pending} | {k: getattr(self, k)[:n].clone() for k in names}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pos, self.size = state["pos"], state["size"]
        self.pending = pending_on(state["pending"], "cpu")  # sequences are assembled in host memory
        for k in ("obs", "actions", "rewards", "terminated", "valid", "starts", "carry0"):
            getattr(self, k)[: self.size] = state[k]


@BUFFERS.register("sequence", spec=BufferSpec(on_policy=False, sequences=True))
def sequence(capacity: int = 100_000, seq_len: int = 20, burn_in: int = 10, sequence_overlap: float = 0.5,
             **context: Any) -> SequenceReplayBuffer:
    """Replay of overlapping fixed-length sequences with their initial recurrent state (R2D2)."""
    if not context.get("carry_size"):
        raise ConfigError("buffer=sequence stores sequences for recurrent actors: use it with algo=dqn actor=gru "
                          "(or lstm)")
    return SequenceReplayBuffer(capacity, seq_len, burn_in, sequence_overlap, context["num_envs"],
                                context["obs_shape"], context["carry_size"], context["device"],
                                context.get("obs_dtype", torch.float32), tuple(context.get("action_shape", ())),
                                bool(context.get("discrete", True)), context.get("normalizer", identity))


