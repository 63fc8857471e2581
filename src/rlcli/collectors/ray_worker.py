"""`collector=ray`'s worker side: a Ray actor that runs the ordinary Collector over its envs for one collect
phase and records what it would have put in the buffer (a fragment). ray_collector.py is the learner side."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

from rlcli.algos.offpolicy import ExplorationNoise
from rlcli.collectors.local import CollectStats
from rlcli.contracts import ActOutput, Learner, OffPolicyLearner, OnPolicyLearner, RecurrentState


class _RecordingNorm:
    """The worker's running normalizer, remembering each batch it is updated with for the learner."""

    def __init__(self, norm: Any) -> None:
        self.norm = norm
        self.batches: list[torch.Tensor] = []

    def update(self, batch: torch.Tensor) -> None:
        if self.norm.enabled:
            self.batches.append(batch.clone())
        self.norm.update(batch)

    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        normalized: torch.Tensor = self.norm(obs)
        return normalized


class _FragmentRecorder:
    """A stand-in buffer: keeps every `add` call's arguments, on the CPU, in order (keyword ones, a masked
    algorithm's `action_mask` and a turn-based env's `acting`, after the positional ones, named in `keywords`)."""

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []
        self.torch_args: tuple[bool, ...] = ()  # which arguments were tensors (the learner's buffer gets them so)
        self.keywords: tuple[str, ...] = ()
        self.acting = None  # a rollout storage that takes a turn-based env's rows (the collector asks)
        self.last_acting: torch.Tensor | None = None  # who acts at the observations the fragment ends on

    def reset(self) -> None:
        self.rows, self.last_acting = [], None

    def add(self, *args: Any, **keywords: Any) -> None:
        every = (*args, *keywords.values())
        self.rows.append(tuple(a.detach().cpu().numpy().copy() if isinstance(a, torch.Tensor) else np.array(a)
                               for a in every))
        self.torch_args = tuple(isinstance(a, torch.Tensor) for a in every)
        self.keywords = tuple(keywords)

    def columns(self) -> list[np.ndarray]:
        """One [steps, envs, ...] array per argument: a few large arrays travel far faster than many small ones."""
        return [np.stack(column) for column in zip(*self.rows, strict=True)]


class _ShardPolicy:
    """The algorithm as the worker's collector sees it: acting on the whole learner-sized batch with this
    worker's observations at its rows (so sampling draws what a local run draws), answering for its rows."""

    def __init__(self, algo: Any, offset: int, count: int, total: int) -> None:
        self.algo, self.rows, self.total = algo, slice(offset, offset + count), total
        self.steps_per_collect = algo.steps_per_collect
        self.episodes_per_collect = 0  # fixed-length fragments: collector=ray refuses train_freq_unit=episode

    def _pad(self, obs: torch.Tensor) -> torch.Tensor:
        full = torch.zeros((self.total, *obs.shape[1:]), dtype=obs.dtype)
        full[self.rows] = obs
        return full

    def act(self, obs: torch.Tensor, deterministic: bool = False, state: RecurrentState | None = None) -> ActOutput:
        padded = None if state is None else RecurrentState(self._pad(state.carry), self._pad(state.starts))
        out = self.algo.act(self._pad(obs), deterministic=deterministic, state=padded)
        return ActOutput(out.actions[self.rows], out.log_probs[self.rows], out.values[self.rows],
                         None if out.carry is None else out.carry[self.rows])

    def act_masked(self, obs: torch.Tensor, action_mask: torch.Tensor, deterministic: bool = False) -> ActOutput:
        """A masked algorithm's acting (the other workers' rows: every action valid, their draws discarded)."""
        full = torch.ones((self.total, *action_mask.shape[1:]), dtype=action_mask.dtype)
        full[self.rows] = action_mask
        out = self.algo.act_masked(self._pad(obs), full, deterministic=deterministic)
        return ActOutput(out.actions[self.rows], out.log_probs[self.rows], out.values[self.rows])

    def random_actions(self, n: int) -> torch.Tensor:
        actions: torch.Tensor = self.algo.random_actions(self.total)
        return actions[self.rows]

    def env_actions(self, actions: torch.Tensor) -> torch.Tensor:
        env_actions: torch.Tensor = self.algo.env_actions(actions)
        return env_actions

    def finish_rollout(self, *args: Any) -> None:
        """The learner finishes the rollout over all envs."""


@dataclass
class Fragment:
    """One collect phase of one worker."""

    version: int  # the learner's iteration whose weights acted
    columns: list[np.ndarray]  # buffer.add's arguments, one [steps, this worker's envs, ...] array each
    torch_args: tuple[bool, ...]  # which arguments the collector passed as tensors
    norm_batches: np.ndarray | None  # [steps, envs, ...]: what the running normalizer was updated with
    last_obs: torch.Tensor  # raw observations after the last step
    stats: CollectStats
    rng: torch.Tensor | None  # torch's RNG state after the fragment (synchronous mode)
    seconds: float = 0.0  # the worker's own time for it
    keywords: tuple[str, ...] = ()  # the names of buffer.add's keyword arguments, the last columns
    last_acting: torch.Tensor | None = None  # a turn-based env's: who acts at `last_obs`
    exploration: dict[str, torch.Tensor] | None = None  # the acting's noise state as the fragment left it
    last_state: RecurrentState | None = None  # a recurrent network's carry and episode starts at `last_obs`


class RolloutWorker:
    """A Ray actor: `count` envs (the learner's envs offset .. offset+count-1) and a CPU copy of the algorithm."""

    def __init__(self, cfg: dict[str, Any], offset: int, count: int, total: int, on_policy: bool) -> None:
        from rlcli.algos.agent import algo_section, build_agent, section
        from rlcli.collectors.local import Collector
        from rlcli.registry import ALGOS, ENVS
        from rlcli.services.runtime import configure_torch, seed_everything

        self.cfg = OmegaConf.create(cfg)
        configure_torch(1, bool(self.cfg.deterministic))
        self.offset, self.count = offset, count
        seed_everything(int(self.cfg.seed) + 7_919 * (offset + 1))  # async mode's own stream; sync sets the learner's
        factory = ENVS.build(section(self.cfg, "env"))
        masks = ALGOS.spec(algo_section(self.cfg)["name"]).action_masks
        self.envs = factory.make(count, str(self.cfg.train.vector_mode),
                                 gamma=float(algo_section(self.cfg).get("gamma", 0.99)), masks=masks)
        agent = build_agent(self.cfg, factory, self.envs.single_observation_space, self.envs.single_action_space,
                            torch.device("cpu"), total, with_addons=False)
        self.algo = agent.algo
        self.policy = _ShardPolicy(self.algo, offset, count, total)
        self.norm = _RecordingNorm(self.algo.networks.normalizer)
        self.recorder = _FragmentRecorder()
        self.collector = Collector(self.envs, self.norm, torch.device("cpu"), seed=int(self.cfg.seed) + offset,  # type: ignore[arg-type]
                                   obs_dtype=agent.obs_dtype, masks=masks, carry_size=agent.carry_size)
        # the stand-ins pair as the learner's algorithm and storage do (they answer only what collecting asks)
        self.learner: Learner = (OnPolicyLearner(self.policy, self.recorder) if on_policy  # type: ignore[arg-type]
                                 else OffPolicyLearner(self.policy, self.recorder))  # type: ignore[arg-type]

    def pid(self) -> int:
        return os.getpid()

    def reset(self, seed: int) -> None:
        self.collector.reset(seed + self.offset)

    def collect(self, weights: dict[str, Any], values: dict[str, Any], rng: torch.Tensor | None,
                random_actions: bool, version: int, exploration: dict[str, torch.Tensor] | None = None) -> Fragment:
        """One collect phase with the learner's weights and settings; synchronous mode (`rng`): from the learner's
        torch stream and its acting noise (`exploration`), so every worker acts as the local run would."""
        start = time.perf_counter()
        self.algo.networks.load_state_dict(weights)
        for key, value in values.items():
            setattr(self.algo, key, value)
        if rng is not None:
            torch.set_rng_state(rng)
        if exploration is not None:
            set_exploration_state(self.algo, exploration)
        self.recorder.reset()
        self.norm.batches = []
        stats = self.collector.collect(self.learner, random_actions=random_actions)
        norm = np.stack([b.numpy() for b in self.norm.batches]) if self.norm.batches else None
        return Fragment(version, self.recorder.columns(), self.recorder.torch_args, norm,
                        self.collector.obs.clone(), stats, torch.get_rng_state() if rng is not None else None,
                        time.perf_counter() - start, self.recorder.keywords, self.recorder.last_acting,
                        exploration_state(self.algo),
                        self.collector.recurrent_state())

    def state(self) -> dict[str, Any]:
        return {"collector": self.collector.state_dict(), "envs": self.collector.env_state()}

    def load_state(self, state: dict[str, Any]) -> bool:
        self.collector.load_state_dict(state["collector"])
        return self.collector.restore_envs(state["envs"]) is None


def exploration_state(algo: Any) -> dict[str, torch.Tensor]:
    """What acting changes in the algorithm besides the torch stream: gSDE's exploration matrices (actors/sde.py;
    the networks keep them) and Ornstein-Uhlenbeck noise's per-env state (TD3's, DDPG's). In synchronous mode every
    worker draws the same for all the run's envs, so one worker's is the local run's."""
    state = {}
    if (gsde := getattr(getattr(algo, "noise_resampling", None), "noise", None)) is not None:
        state["gsde"] = gsde.eps.clone()
    if isinstance(noise := getattr(algo, "noise", None), ExplorationNoise):
        state["noise"] = noise.state.clone()
    return state


def set_exploration_state(algo: Any, state: dict[str, torch.Tensor]) -> None:
    device = next(algo.networks.parameters()).device
    if "gsde" in state:
        algo.noise_resampling.noise.eps = state["gsde"].to(device)
    if "noise" in state:
        algo.noise.state = state["noise"].clone()
