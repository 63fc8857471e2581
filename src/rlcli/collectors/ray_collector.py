"""`collector=ray`: the training envs step on Ray workers; the learner stays in this process.

Each worker (a Ray actor) owns `collector.envs_per_worker` envs and a CPU copy of the algorithm, and
runs the ordinary `Collector` over them for one collect phase (a *fragment*: n_steps steps of its
envs), recording what it would have put in the buffer. The learner receives the fragments, puts
their rows into its buffer in the order a local run would, updates, and broadcasts the weights once
per iteration with `ray.put`. Nothing is called remotely per env step.

Synchronous mode (on-policy algorithms, or `collector.max_policy_lag=0`) reproduces a local run with
the same number of envs exactly: worker w's envs are envs w*M .. w*M+M-1 of the local vector env
(seeded the same way), and each worker acts on the whole batch of observations padded with zeros
around its own rows, with torch's RNG state of the learner, so every sampled action is the one the
local run samples (sampling consumes random numbers by shape, not by value). The learner then takes
the RNG state the workers ended with. Two things stay worker-local and make a run with
`env.normalize_obs` or `env.normalize_reward` differ slightly from a local one: the running
statistics a worker acts with during a fragment (the learner's own statistics see every env, in the
local order), and reward normalization, which is per vector env.

Asynchronous mode (off-policy algorithms with `collector.max_policy_lag` = k >= 1): each worker keeps k
fragments requested ahead, so workers step their envs while the learner updates; a fragment reaches
the replay buffer collected with weights k updates old (logged as collector/policy_lag).

A worker that dies is restarted by Ray (`collector.max_restarts`); its fragment is collected again
from freshly reset envs, with a warning, and counted in collector/restarts.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from rlcli.collectors.env_faults import CollectorError
from rlcli.collectors.local import AgentReturns, CollectStats
from rlcli.collectors.ray_settings import RaySettings
from rlcli.collectors.ray_worker import Fragment, RolloutWorker, exploration_state, set_exploration_state
from rlcli.contracts import Learner, OnPolicyLearner, RecurrentState
from rlcli.registry import ConfigError
from rlcli.services.timing import PhaseClock

logger = logging.getLogger("rlcli")
_PROCESS_TOKEN = secrets.token_hex(32)  # the private Ray instances' auth token (see RayCollector._start)


def acting_values(algo: Any) -> dict[str, Any]:
    """The values schedules set on the algorithm (exploration epsilon, noise scales, ...), as the workers' copies
    must act with them: every setting it declares schedulable."""
    return {name: getattr(algo, name) for name in algo.schedulable}


def cpu_weights(networks: Any) -> dict[str, Any]:
    return {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in networks.state_dict().items()}


@dataclass
class _Pending:
    """A requested fragment, with the request's arguments (to ask again if the worker dies)."""

    ref: Any
    args: tuple[Any, ...]


class RayCollector:
    """The learner's side: starts the workers, sends weights, merges their fragments into the buffer."""

    def __init__(self, cfg: DictConfig, settings: RaySettings, total_envs: int, normalizer: Any,
                 device: torch.device, on_policy: bool, clock: PhaseClock | None = None, start: bool = True,
                 agent_names: list[str] | None = None, agent_groups: dict[str, list[str]] | None = None) -> None:
        self.cfg, self.settings, self.total = cfg, settings, total_envs
        # env=pz: each agent's and group's return over the last 100 episodes, as a local run's collector keeps them
        self.agent_windows = AgentReturns(list(agent_names or []), dict(agent_groups or {}))
        self.normalizer, self.device, self.on_policy = normalizer, device, on_policy
        self.clock = clock or PhaseClock()
        self.each = settings.envs_each(total_envs)
        self.lag = 0 if on_policy else settings.max_policy_lag
        self.workers: list[Any] = []
        self.pending: list[collections.deque[_Pending]] = []
        self.version = 0  # collect calls so far: the weights' age is counted in these
        self.restarts = 0
        self.reset_rows: list[int] = []  # the envs of workers restarted during this collect phase
        self._started_ray = False
        self._ray_environ: dict[str, str] | None = None
        self._seed = int(cfg.seed)
        if not start:  # checked only (a sweep's pre-check): the first collect phase starts them
            return
        # Now, not at the first collect phase: a worker that cannot build fails before any run dir exists, and
        # Ray's own SIGTERM handler (it aborts the process) is in place before the trainer installs its own.
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    @property
    def synchronous(self) -> bool:
        return self.lag == 0

    # ------------------------------------------------------------------------------ start and stop
    def _start(self) -> None:
        if self.workers:
            return
        import ray

        if not ray.is_initialized():
            # ray.init sets RAY_* variables in this process (RAY_AUTH_MODE, ...): put them back at close
            self._ray_environ = {k: v for k, v in os.environ.items() if k.startswith("RAY_")}
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            if self.settings.address is None:
                if not {"RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"} & set(os.environ):
                    # Ray's token auth, with a token of this instance's own: otherwise Ray writes one to
                    # ~/.ray/auth_token, which then switches the user's other Ray clusters to token auth
                    os.environ["RAY_AUTH_TOKEN"] = _PROCESS_TOKEN  # one per process: Ray caches the first it reads
                need = self.settings.workers * self.settings.cpus_per_worker
                init = partial(ray.init, num_cpus=max(os.cpu_count() or 1, int(np.ceil(need))),
                               include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False,
                               _node_ip_address="127.0.0.1")
            else:
                init = partial(ray.init, address=self.settings.address, logging_level=logging.ERROR,
                               log_to_driver=False)
            self._started_ray = True  # from here on: close() shuts down what ray.init started, if it stops midway
            _init_keeping_sigterm(init)
            _keep_python_signal_handlers()
        actor = ray.remote(RolloutWorker).options(
            num_cpus=self.settings.cpus_per_worker, max_restarts=self.settings.max_restarts, max_task_retries=0)
        config = OmegaConf.to_container(self.cfg, resolve=True)
        self.workers = [actor.remote(config, w * self.each, self.each, self.total, self.on_policy)
                        for w in range(self.settings.workers)]
        self.pending = [collections.deque() for _ in self.workers]
        from ray.exceptions import RayActorError

        try:
            ray.get([w.pid.remote() for w in self.workers])  # built: a worker that cannot build fails here, once
        except RayActorError as error:
            raise ConfigError(f"collector=ray: a worker could not start: {_cause(error)}") from None

    def close(self) -> None:
        if not self.workers and not self._started_ray:
            return
        import ray

        for worker in self.workers:
            ray.kill(worker, no_restart=True)
        self.workers, self.pending = [], []
        if self._started_ray:
            with contextlib.suppress(Exception):  # (a ray.init a signal stopped midway: what it started)
                ray.shutdown()
            self._started_ray = False
        if self._ray_environ is not None:
            for key in [k for k in os.environ if k.startswith("RAY_")]:
                del os.environ[key]
            os.environ.update(self._ray_environ)
            self._ray_environ = None

    # --------------------------------------------------------------------------------- collecting
    def collect(self, learner: Learner, random_actions: bool = False) -> CollectStats:
        self._start()
        algo = learner.algo
        import ray

        t0 = time.perf_counter()
        self.version += 1
        weights = ray.put(cpu_weights(algo.networks))
        values = acting_values(algo)
        rng = torch.get_rng_state() if self.synchronous else None
        exploration = exploration_state(algo) if self.synchronous else None  # (a resumed run's, as saved)
        for w, queue in enumerate(self.pending):
            if not queue:
                self._submit(w, weights, values, rng, random_actions, exploration)
        fragments = [self._receive(w) for w in range(len(self.workers))]
        if self.reset_rows and callable(envs_reset := getattr(learner.buffer, "envs_reset", None)):
            envs_reset(self.reset_rows)  # a restarted worker's envs began new episodes: what a replay was gathering
        self.reset_rows = []
        for w in range(len(self.workers)):  # keep `lag` fragments in flight: they collect during the update
            while len(self.pending[w]) < self.lag:
                self._submit(w, weights, values, None, random_actions)
        t1 = time.perf_counter()
        if rng is not None:
            assert fragments[0].rng is not None
            torch.set_rng_state(fragments[0].rng)  # every worker drew the same numbers: the learner goes on from there
            if fragments[0].exploration:  # and the same acting noise (gSDE's matrices, OU's state)
                set_exploration_state(algo, fragments[0].exploration)
        stats = self._merge(learner, fragments)
        t2 = time.perf_counter()
        seconds = self.clock.seconds
        seconds["env"] += t1 - t0  # waiting for the workers: their acting and env steps
        seconds["buffer"] += t2 - t1
        stats.scalars |= {"collector/policy_lag": float(np.mean([self.version - f.version for f in fragments])),
                         "collector/restarts": float(self.restarts),
                         "collector/fragment_seconds": float(np.mean([f.seconds for f in fragments]))}
        return stats

    def _submit(self, w: int, weights: Any, values: dict[str, Any], rng: torch.Tensor | None,
                random_actions: bool, exploration: dict[str, torch.Tensor] | None = None) -> None:
        args = (weights, values, rng, random_actions, self.version, exploration)
        self.pending[w].append(_Pending(self.workers[w].collect.remote(*args), args))

    def _receive(self, w: int) -> Fragment:
        """Worker w's oldest fragment; if the worker died, Ray restarts it and the fragment is collected again."""
        import ray
        from ray.exceptions import ActorDiedError, RayActorError

        pending = self.pending[w].popleft()
        deaths = 0
        while True:
            try:
                fragment: Fragment = ray.get(pending.ref)
                return fragment
            except ActorDiedError as error:  # Ray gave up on it: collector.max_restarts used up
                limit = self.settings.max_restarts
                raise CollectorError(f"collector=ray: worker {w} died and Ray will not restart it again "
                                     f"(collector.max_restarts={limit}): {_first_line(error)}") from None
            except RayActorError as error:  # died; Ray is restarting it
                deaths += 1
                self.restarts += 1
                if deaths > max(1, self.settings.max_restarts):
                    raise CollectorError(f"collector=ray: worker {w} died {deaths} times in a row "
                                         f"({_first_line(error)}); stopping") from None
                _warn(f"collector=ray: worker {w} died ({_first_line(error)}); Ray restarts it and its fragment is "
                      f"collected again from freshly reset envs (restart {self.restarts})")
                self._drop_pending(w)  # requests queued behind the lost one died with it
                self._when_back(w, lambda worker: worker.reset.remote(self._seed + 1_000_003 * self.restarts))
                self.reset_rows.extend(range(w * self.each, (w + 1) * self.each))
                pending = _Pending(self.workers[w].collect.remote(*pending.args), pending.args)

    def _when_back(self, w: int, call: Any, timeout: float = 120.0) -> Any:
        """`call(worker)` once the restarting worker answers (its restart is not counted again)."""
        import ray
        from ray.exceptions import ActorDiedError, RayActorError

        deadline = time.monotonic() + timeout
        while True:
            try:
                return ray.get(call(self.workers[w]))
            except ActorDiedError:
                raise
            except RayActorError:
                if time.monotonic() > deadline:
                    raise CollectorError(f"collector=ray: worker {w} did not come back in {timeout:.0f} s") from None
                time.sleep(0.2)

    def _merge(self, learner: Learner, fragments: list[Fragment]) -> CollectStats:
        """The fragments' rows into the buffer, step by step, env-major in worker order: what a local run adds."""
        buffer = learner.buffer
        if isinstance(learner, OnPolicyLearner):
            learner.buffer.reset()
        columns = [np.concatenate([f.columns[i] for f in fragments], axis=1) for i in range(len(fragments[0].columns))]
        norm = (np.concatenate([f.norm_batches for f in fragments], axis=1)
                if fragments[0].norm_batches is not None else None)
        as_torch, keywords = fragments[0].torch_args, fragments[0].keywords
        steps = columns[0].shape[0]
        for t in range(steps):
            if norm is not None:
                self.normalizer.update(torch.from_numpy(norm[t]).to(self.device))
            row: list[Any] = [torch.from_numpy(column[t]).to(self.device) if is_tensor else column[t]
                              for column, is_tensor in zip(columns, as_torch, strict=True)]
            named = dict(zip(keywords, row[len(row) - len(keywords):], strict=True))
            buffer.add(*row[:len(row) - len(keywords)], **named)  # what the worker's collector gave its stand-in
        if isinstance(learner, OnPolicyLearner):
            if acting := [f.last_acting for f in fragments if f.last_acting is not None]:  # a turn-based env's
                cast(Any, buffer).last_acting = torch.cat(acting).to(self.device)  # (as the local collector's `end`)
            last = torch.cat([f.last_obs for f in fragments]).to(self.device)
            states = [f.last_state for f in fragments if f.last_state is not None]  # a recurrent network's
            state = RecurrentState(*(torch.cat(parts).to(self.device) for parts in zip(*states, strict=True))) \
                if states else None
            learner.algo.finish_rollout(learner.buffer, self.normalizer(last), state)
        stats = CollectStats(steps=steps * self.total)
        order = sorted((step, k, i) for k, f in enumerate(fragments) for i, step in enumerate(f.stats.episode_steps))
        for step, k, i in order:  # episodes in the order a local run finishes them: by step, then env
            stats.episode_returns.append(fragments[k].stats.episode_returns[i])
            stats.episode_lengths.append(fragments[k].stats.episode_lengths[i])
            stats.episode_steps.append(step)
            # env=pz: a copy's episode gives one return per agent, in the same order as the team's
            self.agent_windows.add(stats, {name: [float(agents[i])] for name, agents
                                           in fragments[k].stats.agent_episodes.items()})
        return stats

    # ------------------------------------------------------------------------ state for checkpoints
    def reset(self, seed: int) -> None:
        self._start()
        import ray

        self._drain()
        ray.get([w.reset.remote(seed) for w in self.workers])

    def _drain(self) -> None:
        for w in range(len(self.pending)):
            self._drop_pending(w)

    def _drop_pending(self, w: int) -> None:
        import ray

        for pending in self.pending[w]:
            with contextlib.suppress(Exception):  # a dead worker's requests are gone already
                ray.cancel(pending.ref, force=False)
        self.pending[w].clear()

    def describe(self) -> str:
        mode = "synchronous" if self.synchronous else f"asynchronous, policy lag {self.lag}"
        where = self.settings.address or "a private Ray instance"
        return f"collector=ray ({self.settings.workers} workers x {self.each} envs on {where}, {mode})"

    def state_dict(self) -> dict[str, object]:
        return {"workers": self.settings.workers, "envs_per_worker": self.each, "version": self.version,
                "restarts": self.restarts, "recent_agent_returns": self.agent_windows.state_dict()}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.version, self.restarts = int(state.get("version", 0)), int(state.get("restarts", 0))  # type: ignore[call-overload]
        self.agent_windows.load_state_dict(state.get("recent_agent_returns"))

    def env_state(self) -> Any:
        """Each worker's envs and collector state (synchronous mode, between iterations: nothing in flight)."""
        if not self.synchronous or not self.workers:
            return None
        import ray

        return ray.get([w.state.remote() for w in self.workers])

    def restore_envs(self, state: Any) -> str | None:
        if not self.synchronous:
            return ("collector=ray in asynchronous mode (off-policy, collector.max_policy_lag > 0): the workers' envs "
                    "and their fragments in flight were not saved; the envs were reset, so this resume continues "
                    "from fresh episodes")
        if state is None or len(state) != self.settings.workers:
            return ("the checkpoint holds no state for the Ray workers' envs (or for another number of workers): "
                    "the envs were reset, so this resume continues from fresh episodes rather than exactly")
        self._start()
        import ray

        if not all(ray.get([w.load_state.remote(s) for w, s in zip(self.workers, state, strict=True)])):
            return ("the Ray workers' env state could not be restored (e.g. async vector envs): the envs were "
                    "reset, so this resume continues from fresh episodes rather than exactly")
        return None


def _init_keeping_sigterm(init: Callable[[], Any]) -> None:
    """ray.init, with a SIGTERM during it answered by rl-train's own handler (its one start-up line): ray.init sets a
    handler of its own first, which ends the process with exit code 15 and no word."""
    import signal

    ours = signal.getsignal(signal.SIGTERM)
    try:
        init()
    except SystemExit as stop:
        if stop.code != signal.SIGTERM or not callable(ours):
            raise
        ours(signal.SIGTERM, None)  # rl-train's start-up handler raises its stop here
        raise


def _keep_python_signal_handlers() -> None:
    """ray.init installs a C-level SIGTERM handler that aborts the process; put rl-train's own back (its
    checkpoint-then-exit on SIGTERM, and the one-line stop during start-up)."""
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(sig)
        if callable(handler) or handler in (signal.SIG_DFL, signal.SIG_IGN):
            with contextlib.suppress(ValueError):  # not the main thread
                signal.signal(sig, handler)


def _cause(error: BaseException) -> str:
    """The worker's own exception from the report Ray wraps it in (its last `Name: text` line)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    errors = [line for line in lines if line.split(":", 1)[0].endswith(("Error", "Exception"))]
    return (errors or lines or [type(error).__name__])[-1][:300]


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:200] if text else type(error).__name__


def _warn(text: str) -> None:
    print(f"rl-train: warning: {text}", file=sys.stderr)
    logger.info("warning: %s", text)
