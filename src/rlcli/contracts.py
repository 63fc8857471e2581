"""The contracts between the parts: what each component declares, and what the loop may call.

Specs are data that a component registers with its name (`@ALGOS.register("ppo", spec=...)`); the
build step reads them to check and wire a run, so nothing probes objects for attributes. The two
Protocols are what the collector and the trainer call on an algorithm. The run's clock and the
recurrent state are passed in and out explicitly; nothing sets them on an algorithm from outside.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlcli.batches import ReplayBatch, RolloutBatch, SequenceBatch
from rlcli.schedules import Schedule

# ------------------------------------------------------------------------------------------ specs


# The action spaces an on-policy algorithm with rlcli's heads takes (actors/heads.py has one head for each).
ON_POLICY_ACTIONS = ("Discrete", "Box", "MultiDiscrete", "MultiBinary")


PopulationKind = Literal["on_policy", "lockstep"]


@dataclass(frozen=True)
class AlgoSpec:
    """What an algorithm needs and supports; the build step checks a config against it."""

    on_policy: bool
    action_spaces: tuple[str, ...] = ("Discrete", "Box")  # gymnasium space class names
    networks: tuple[str, ...] | None = None  # accepted `actor=` choices; None: every registered one
    value_outputs: int = 1  # value heads of the on-policy network (rnd_ppo: extrinsic + intrinsic)
    # raises a one-line ConfigError when the env's observations do not fit (rnd_ppo: flat Box only)
    check_observations: Callable[[gym.spaces.Space[Any], str], None] | None = None
    # acts on and learns from the env's valid-action masks (envs/masks.py): the collector and the test
    # phase read them from the env and call `act_masked` (MaskedPolicy) instead of `act`
    action_masks: bool = False
    # what the `actor=` recipe hands the algorithm: a whole actor-critic, or a recipe from which the
    # algorithm builds its own networks; None = actor_critic for on-policy algorithms, recipe otherwise
    network_kind: Literal["actor_critic", "recipe"] | None = None
    # `compile=true` is implemented: the class steps its optimizers through LossSteps, which `enable_compile`
    # compiles (algos/loss_step.py), and may name what they do not cover in `compile_refusal() -> str | None`
    compiles: bool = False
    # learns only from a dataset (`dataset=`; bc, td3_bc, iql, cql, awac, rebrac): an offline run, budget in gradient
    # steps. An online off-policy algorithm may also be given a dataset (it then starts from it)
    offline: bool = False
    # the batched update a population of its runs takes (hydra/launcher=population, sweeps/population/lockstep.py);
    # None: a population sweep trains its jobs one at a time. The lists of what can batch are read from here.
    population: PopulationKind | None = None
    # on-policy: its advantages and returns are the rollout's own (`RolloutStorage.compute_returns`, GAE), which on a
    # turn-based env folds a player's waiting steps into its transition (envs/turn_based.py); False where the
    # algorithm computes its own from the rollout (rnd_ppo's two streams, pqn's Q(lambda)), which would not
    rollout_returns: bool = True

    @property
    def heads(self) -> Literal["actor_critic", "recipe"]:
        if self.network_kind is not None:
            return self.network_kind
        return "actor_critic" if self.on_policy else "recipe"


@dataclass(frozen=True)
class BufferSpec:
    """What a storage holds: a rollout for on-policy algorithms or replay for off-policy ones, and
    whether it stores whole sequences (what recurrent off-policy networks learn from)."""

    on_policy: bool
    sequences: bool = False


@dataclass(frozen=True)
class NetworkSpec:
    """What an `actor=` recipe builds: recurrent networks carry state between steps; image networks
    read uint8 pixels when the env gives them."""

    recurrent: bool = False
    image: bool = False
    sde: bool = False  # builds gSDE's state-dependent noise when the algorithm sets algo.use_sde


# ------------------------------------------------------------------------------- values passed in


@dataclass(frozen=True)
class RunClock:
    """The run's clock as an update sees it; the trainer owns the counters."""

    env_steps: int
    total_steps: int
    # transitions the collect phase this update follows stored (all envs; the reset step a gymnasium vector env
    # takes after an episode ends stores none)
    transitions: int = 0

    @property
    def progress(self) -> float:
        """0 -> 1 over train.total_steps."""
        return min(1.0, self.env_steps / self.total_steps)


class RecurrentState(NamedTuple):
    """What a recurrent network reads at one acting step: its carry from the previous step, and 1.0
    for the envs whose episode begins at this step (their carry is zeroed first)."""

    carry: torch.Tensor
    starts: torch.Tensor


class ActOutput(NamedTuple):
    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor
    carry: torch.Tensor | None = None  # recurrent networks: the carry after this step


class EvalOutput(NamedTuple):
    """An actor's reading of a batch's actions: their log-probabilities, the policy's entropy, the values."""

    log_probs: torch.Tensor
    entropy: torch.Tensor
    values: torch.Tensor


# ------------------------------------------------------------------------------------ storages


class Storage(Protocol):
    """What every storage kind gives the loop and the checkpoints."""

    default_schedules: dict[str, Schedule]  # values over the run (PER's beta, ERE's eta); most have none

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class RolloutStorage(Storage, Protocol):
    """An on-policy rollout: [n_steps, num_envs] steps, filled by the collector, finished with returns and
    advantages by the algorithm (`compute_returns`), read whole (`flat`) or by whole env sequences."""

    n_steps: int
    num_envs: int
    obs: torch.Tensor
    rewards: torch.Tensor
    values: torch.Tensor
    terminated: torch.Tensor
    dones: torch.Tensor
    valid: torch.Tensor  # 0 at reset steps, which every loss masks out
    advantages: torch.Tensor
    returns: torch.Tensor

    def add(self, obs: torch.Tensor, actions: torch.Tensor, log_probs: torch.Tensor, values: torch.Tensor,
            rewards: torch.Tensor | np.ndarray, terminated: torch.Tensor | np.ndarray,
            dones: torch.Tensor | np.ndarray, valid: torch.Tensor | np.ndarray, starts: torch.Tensor | None = None,
            carry: torch.Tensor | None = None, action_mask: torch.Tensor | None = None) -> None:
        """One vector-env step; `rewards` ... `valid` as the envs gave them (numpy arrays) or as tensors."""
        ...

    def reset(self) -> None: ...

    def compute_returns(self, last_values: torch.Tensor, gamma: float, gae_lambda: float) -> None: ...

    def flat(self) -> RolloutBatch: ...

    def env_batch(self, envs: torch.Tensor) -> RolloutBatch: ...


class ReplayStorage(Storage, Protocol):
    """Transitions for off-policy algorithms. Every replay storage has `update_priorities`; where sampling is
    uniform it does nothing, so no algorithm asks whether its storage is prioritized."""

    capacity: int  # transitions

    def __len__(self) -> int: ...

    def add(self, obs: torch.Tensor, actions: torch.Tensor, rewards: np.ndarray, next_obs: np.ndarray,
            terminated: np.ndarray, dones: np.ndarray, valid: np.ndarray) -> None:
        """One vector-env step; `valid` is False at reset steps, which store nothing."""
        ...

    def sample(self, batch_size: int, step: int = 0, steps: int = 1) -> ReplayBatch:
        """`step` of `steps`: the gradient step this batch is for (ERE narrows its window over them)."""
        ...

    def update_priorities(self, indices: torch.Tensor, td_errors: torch.Tensor) -> None: ...


class SequenceStorage(Storage, Protocol):
    """Whole sequences with the carry they began with, for recurrent off-policy networks (R2D2's storage)."""

    capacity: int  # sequences
    burn_in: int  # steps at each sequence's start that only warm the carry up

    def __len__(self) -> int: ...

    def add(self, obs: torch.Tensor, actions: torch.Tensor, rewards: np.ndarray, next_obs: np.ndarray,
            terminated: np.ndarray, dones: np.ndarray, valid: np.ndarray, starts: torch.Tensor,
            carry: torch.Tensor) -> None: ...

    def sample(self, batch_size: int, step: int = 0, steps: int = 1) -> SequenceBatch: ...

    def update_priorities(self, indices: torch.Tensor, td_errors: torch.Tensor) -> None: ...


# ------------------------------------------------------------------------------------- protocols


class Networks(Protocol):
    """The set of networks an algorithm owns (policy, critics, targets, ...), saved as one module.
    `normalizer` holds the observation statistics that every network of the set reads through."""

    normalizer: nn.Module

    def state_dict(self) -> Mapping[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> Any: ...


@runtime_checkable
class RecurrentNetworks(Protocol):
    carry_size: int

    def initial_carry(self, n: int, device: torch.device | str = "cpu") -> torch.Tensor: ...


class Algorithm(Protocol):
    """What both kinds of algorithm provide to the collector, the tests and the checkpoints."""

    networks: Any  # Networks; Any so that algorithms may name their concrete module type
    # env steps per env in one collect phase: on-policy algorithms' algo.n_steps (the rollout), off-policy ones'
    # algo.train_freq (the env steps between two updates)
    steps_per_collect: int
    gamma: float
    # the values over the run that its settings imply (epsilon, lr_scale, ...); see schedules.py
    default_schedules: dict[str, Schedule]
    # the numeric settings `algo.schedules` may move during a run: attributes of these names (besides lr)
    schedulable: tuple[str, ...]

    def optimizers(self) -> list[torch.optim.Optimizer]:
        """Every optimizer, for `algo.schedules.lr` and the generic `lr_scale`."""
        ...

    def act(self, obs: torch.Tensor, deterministic: bool = False, state: RecurrentState | None = None) -> ActOutput:
        """Actions for normalized observations (exploration values such as epsilon come from schedules)."""
        ...

    def env_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """What the env receives for `act`'s actions (clipped or rescaled to its bounds), in torch on the
        actions' device: the collector moves it to numpy, and an exported policy folds it in."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class OnPolicyAlgorithm(Algorithm, Protocol):
    def finish_rollout(self, buffer: RolloutStorage, last_obs: torch.Tensor, state: RecurrentState | None) -> None:
        """After a full rollout: compute what `update` learns from (returns and advantages)."""
        ...

    def update(self, buffer: RolloutStorage, clock: RunClock) -> dict[str, torch.Tensor]: ...


class MaskedPolicy(Protocol):
    """An algorithm whose spec says `action_masks`: it acts only among the valid actions."""

    def act_masked(self, obs: torch.Tensor, action_mask: torch.Tensor, deterministic: bool = False) -> ActOutput:
        """Like `act`; `action_mask` [B, n_actions] bool, True where an action is valid."""
        ...


class OffPolicyAlgorithm(Algorithm, Protocol):
    batch_size: int
    learning_starts: int  # env steps of uniformly random actions before the first update
    # 0: a collect phase is steps_per_collect steps of each env; n > 0: it lasts until n episodes have ended
    # (SB3's train_freq=(n, "episode")), and steps_per_collect is 1
    episodes_per_collect: int

    def random_actions(self, n: int) -> torch.Tensor: ...

    def update(self, buffer: ReplayStorage | SequenceStorage, clock: RunClock) -> dict[str, torch.Tensor]:
        """Gradient steps on batches the storage samples (sequences when the networks are recurrent)."""
        ...


# ------------------------------------------------------------------------------------- the pairs


@dataclass(frozen=True)
class OnPolicyLearner:
    """An on-policy algorithm and the rollout it learns from. The build pairs each algorithm with a storage of
    its kind, so the loop and the collector call both with their own types instead of asking `spec.on_policy`."""

    algo: OnPolicyAlgorithm
    buffer: RolloutStorage

    def update(self, clock: RunClock) -> dict[str, torch.Tensor]:
        return self.algo.update(self.buffer, clock)


@dataclass(frozen=True)
class OffPolicyLearner:
    """An off-policy algorithm and its replay (transitions, or sequences for recurrent networks)."""

    algo: OffPolicyAlgorithm
    buffer: ReplayStorage | SequenceStorage

    def update(self, clock: RunClock) -> dict[str, torch.Tensor]:
        return self.algo.update(self.buffer, clock)


Learner = OnPolicyLearner | OffPolicyLearner
