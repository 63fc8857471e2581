"""Off-policy replay storage: uniform (`replay`) and n-step (`nstep`) in one preallocated ring.

Each stored transition carries its own discount: gamma^k for a k-step return that ends in a
bootstrap, 0 when the episode terminated inside it. Algorithms then use one formula,
`target = reward + discount * Q(next_obs)`, whatever n is. With NEXT_STEP autoreset the step that
ends an episode returns the true final observation, so a truncated episode bootstraps from it; the
following reset step is not a transition and is never stored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import torch

from rlcli.batches import ReplayBatch
from rlcli.contracts import BufferSpec
from rlcli.registry import BUFFERS, require
from rlcli.schedules import Schedule

REPLAY = BufferSpec(on_policy=False)


def identity(x: torch.Tensor) -> torch.Tensor:
    """The normalizer of a storage built on its own (tests, scripts): batches as stored."""
    return x


def pending_on(pending: list[list[tuple[Any, ...]]], device: torch.device | str) -> list[list[tuple[Any, ...]]]:
    """Per-env steps not yet written, with their tensors on `device`: a checkpoint loaded with
    `map_location=<training device>` moves them there, and mixing devices in one `torch.stack` fails."""
    return [[tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in step) for step in steps]
            for steps in pending]


def storage_device(
    device: torch.device, nbytes: int, choice: str = "auto", free_bytes: int | None = None
) -> torch.device:
    """Where replay lives: the training device, or host memory when it would not fit there (auto).

    On a GPU, `auto` keeps the buffer in GPU memory while it takes under 80% of what is free, and in
    pinned host memory otherwise; batches then move to the GPU with one non-blocking copy each.
    """
    if choice == "cpu" or device.type == "cpu":
        return torch.device("cpu")
    if choice == "device":
        return device
    if free_bytes is None:
        free_bytes = torch.cuda.mem_get_info(device)[0]
    return device if nbytes < 0.8 * free_bytes else torch.device("cpu")


class ReplayBuffer:
    """Preallocated circular storage (see `storage_device` for where); memory is flat once full."""

    def __init__(
        self,
        capacity: int,
        n_step: int,
        num_envs: int,
        obs_shape: tuple[int, ...],
        action_shape: tuple[int, ...],
        discrete: bool,
        device: torch.device,
        gamma: float,
        storage: str = "auto",
        obs_dtype: torch.dtype = torch.float32,
        normalizer: Callable[[torch.Tensor], torch.Tensor] = identity,
    ) -> None:
        require(capacity > 0, "buffer.capacity", capacity, "must be > 0")
        require(n_step > 0, "buffer.n_step", n_step, "must be >= 1")
        self.capacity, self.n_step, self.gamma, self.device = capacity, n_step, gamma, device
        self.num_envs, self.normalizer = num_envs, normalizer
        self.default_schedules: dict[str, Schedule] = {}  # values over the run (PER: beta, ERE: eta)
        self.obs_dtype = obs_dtype  # uint8 for pixels (actor=cnn): a quarter of float32's memory
        obs_bytes = torch.empty(0, dtype=obs_dtype).element_size()
        per_item = (2 * obs_bytes * int(np.prod(obs_shape))
                    + 4 * (int(np.prod(action_shape)) * (2 if discrete else 1) + 2))
        self.storage = storage_device(device, capacity * per_item, storage)
        pin = self.storage.type == "cpu" and device.type == "cuda"

        def zeros(*shape: int, dtype: torch.dtype = torch.float32, lazy: bool = False) -> torch.Tensor:
            # lazy: left uninitialized, so host memory is committed as transitions arrive, not all at
            # once (2 x 100k Atari frames are 5.6 GB); only slots below `size` are ever read
            tensor = (torch.empty if lazy else torch.zeros)(*shape, dtype=dtype, device=self.storage)
            return tensor.pin_memory() if pin else tensor

        self.obs = zeros(capacity, *obs_shape, dtype=obs_dtype, lazy=True)
        self.next_obs = zeros(capacity, *obs_shape, dtype=obs_dtype, lazy=True)
        self.actions = zeros(capacity, *action_shape, dtype=torch.long if discrete else torch.float32)
        self.rewards = zeros(capacity)
        self.discounts = zeros(capacity)
        self.pos = 0
        self.size = 0
        # n-step: per env, the (obs, action, reward) of steps whose return is not complete yet
        self.pending: list[list[tuple[Any, Any, float]]] = [[] for _ in range(num_envs)]

    def __len__(self) -> int:
        return self.size

    def add(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor,
        rewards: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
        dones: np.ndarray,
        valid: np.ndarray,
    ) -> None:
        """One step of the vector env. `valid` is False for reset steps, which are skipped."""
        obs, actions = obs.to(self.storage), actions.to(self.storage)
        if self.n_step == 1:
            keep = np.flatnonzero(valid)
            if keep.size < len(valid):  # reset steps are skipped: chosen on the host (a boolean mask on a GPU
                rows = torch.as_tensor(keep, device=self.storage)  # tensor waits for the GPU, once per tensor)
                obs, actions = obs.index_select(0, rows), actions.index_select(0, rows)
                rewards, next_obs, terminated = rewards[keep], next_obs[keep], terminated[keep]
            discounts = self.gamma * (1.0 - terminated.astype(np.float32))
            self._write(obs, actions, self._t(rewards), self._obs(next_obs), self._t(discounts))
            return
        out: list[tuple[Any, Any, float, Any, float]] = []
        for i in np.flatnonzero(valid):
            pending = self.pending[i]
            pending.append((obs[i], actions[i], float(rewards[i])))
            if dones[i]:
                while pending:  # flush: shorter returns that end at the episode's end
                    out.append(self._n_step_transition(pending, next_obs[i], bool(terminated[i])))
                    pending.pop(0)
            elif len(pending) == self.n_step:
                out.append(self._n_step_transition(pending, next_obs[i], False))
                pending.pop(0)
        if out:
            o, a, r, n, d = zip(*out, strict=True)
            self._write(torch.stack(o), torch.stack(a), self._t(np.array(r)), self._obs(np.stack(n)),
                        self._t(np.array(d)))

    def envs_reset(self, rows: list[int]) -> None:
        """These envs were reset in mid-episode (a resume that could not restore them, a restarted Ray worker): the
        steps still gathering their n-step returns would add the next episode's rewards, so they go."""
        for i in rows:
            self.pending[i] = []

    def _n_step_transition(self, pending: list, next_obs: np.ndarray, terminated: bool) -> tuple:
        ret = sum(self.gamma**j * r for j, (_, _, r) in enumerate(pending))
        discount = 0.0 if terminated else self.gamma ** len(pending)
        return pending[0][0], pending[0][1], ret, next_obs, discount

    def _t(self, x: Any) -> torch.Tensor:
        return torch.as_tensor(x, dtype=torch.float32, device=self.storage)

    def _obs(self, x: Any) -> torch.Tensor:
        return torch.as_tensor(x, dtype=self.obs_dtype, device=self.storage)

    def _write(self, obs, actions, rewards, next_obs, discounts) -> None:
        n = obs.shape[0]
        if n == 0:  # every env was on a reset step
            return
        start = self.pos
        where = (start + np.arange(n)) % self.capacity
        # a slice where the ring does not wrap: plain copies, no index tensor to build and send
        rows = slice(start, start + n) if start + n <= self.capacity else torch.as_tensor(where, device=self.storage)
        # (an index tensor takes only the storage's dtype: joint actions are integers kept as floats)
        self.obs[rows], self.actions[rows], self.rewards[rows] = obs, actions.to(self.actions.dtype), rewards
        self.next_obs[rows], self.discounts[rows] = next_obs, discounts
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)
        self._on_write(where)

    def _on_write(self, where: np.ndarray) -> None:
        """Hook for prioritized replay (new transitions get the maximum priority); `where`: their slots."""

    def _batch(self, idx: torch.Tensor, weights: torch.Tensor | None = None) -> ReplayBatch:
        """Gather on the storage device; one non-blocking copy per tensor to the training device."""
        if self.storage.type == "cuda" and idx.device.type == "cpu":
            idx = idx.pin_memory().to(self.storage, non_blocking=True)  # a pageable copy would wait for the GPU
        else:
            idx = idx.to(self.storage)
        w = torch.ones(idx.shape[0], device=self.device) if weights is None else weights

        def move(x: torch.Tensor) -> torch.Tensor:
            return x.to(self.device, non_blocking=True)

        return ReplayBatch(self.normalizer(move(self.obs[idx])), move(self.actions[idx]), move(self.rewards[idx]),
                           self.normalizer(move(self.next_obs[idx])), move(self.discounts[idx]), move(w), move(idx))

    def update_priorities(self, indices: torch.Tensor, td_errors: torch.Tensor) -> None:
        """Uniform sampling keeps no priorities: nothing to update (buffer=per overrides this)."""

    def sample(self, batch_size: int, step: int = 0, steps: int = 1) -> ReplayBatch:
        """A uniform batch; `step` and `steps` (k of K in an update phase) are for ERE's recency window."""
        idx = torch.randint(0, self.size, (batch_size,))  # torch's CPU generator: resume draws the same
        return self._batch(idx)

    def state_dict(self) -> dict[str, Any]:
        n = self.size
        return {"pos": self.pos, "size": n, "pending": self.pending,
                **{k: getattr(self, k)[:n].clone() for k in ("obs", "next_obs", "actions", "rewards", "discounts")}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pos, self.size = state["pos"], state["size"]
        self.pending = pending_on(state["pending"], self.storage)
        for k in ("obs", "next_obs", "actions", "rewards", "discounts"):
            getattr(self, k)[: self.size] = state[k].to(self.storage)


Storage = Literal["auto", "device", "cpu"]


@BUFFERS.register("replay", spec=REPLAY)
def replay(capacity: int = 1_000_000, n_step: int = 1, storage: Storage = "auto", **context: Any) -> ReplayBuffer:
    """Uniform replay; `n_step` > 1 stores n-step returns."""
    return ReplayBuffer(capacity, n_step, **_replay_context(context), storage=storage)


@BUFFERS.register("nstep", spec=REPLAY)
def nstep(capacity: int = 1_000_000, n_step: int = 3, storage: Storage = "auto", **context: Any) -> ReplayBuffer:
    """Uniform replay of n-step returns (n-step Q-learning targets)."""
    return ReplayBuffer(capacity, n_step, **_replay_context(context), storage=storage)


def _replay_context(context: dict[str, Any]) -> dict[str, Any]:
    keys = ("num_envs", "obs_shape", "action_shape", "discrete", "device", "gamma")
    return {k: context[k] for k in keys} | {"obs_dtype": context.get("obs_dtype", torch.float32),
                                            "normalizer": context.get("normalizer", identity)}



