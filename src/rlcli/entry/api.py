"""rlcli from Python: the runs of rl-train and the evaluations and exports of rl-eval, as functions.

    import rlcli

    run = rlcli.train(algo="ppo", env="CartPole-v1", train={"total_steps": 100_000})
    policy = rlcli.load(run.run_dir, load="best")
    action, state = policy.predict(obs)
    rlcli.evaluate(policy, episodes=10).mean_return

`train` composes the same config as `rl-train` from the same overrides (a list of `key=value` strings
and/or keyword arguments), checks it the same way, writes the same run directory and runs the same
loop; bad input and failed runs raise `RlcliError` with rl-train's one-line message. Nothing here
imports torch until it is called, so `import rlcli` stays as fast as the CLI's start-up.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import re
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rlcli.entry.api_errors import InvalidType, InvalidValue, NotFound, RlcliError
from rlcli.run.callbacks import Callback

if TYPE_CHECKING:
    import numpy as np

    from rlcli.entry.run_loading import Loaded

LoadWhich = Literal["best", "last"] | int
# env= of train / load / evaluate: an env config name or gymnasium id, a function that makes an env, an env instance
# or a gymnasium VectorEnv (Any: gymnasium is imported only when one is given)
EnvSource = str | Callable[..., Any] | Any


# ------------------------------------------------------------------------------------------------ train
@dataclass
class Run:
    """A finished (or stopped) training run: where it is, how far it got, and its agents."""

    run_dir: Path
    env_steps: int
    final_test_return: float | None  # the last test phase's mean return (None: no test phase ran)
    best_test_return: float | None
    stop_reason: str  # budget, stop_reward, a callback's reason (pruned, ...), or "already finished"
    finished: bool  # False: a callback stopped it; rlcli.train(resume=run.run_dir) continues it

    def load(self, which: LoadWhich = "best", device: str = "cpu") -> Policy:
        """The run's policy: best (the best test phase's), last, or a checkpoint's env steps."""
        return load(self.run_dir, load=which, device=device)

    @cached_property
    def agent(self) -> Policy:
        """The trained agent as the run ended (its last checkpoint), on the CPU."""
        return self.load("last")

    def save(self, path: str | Path) -> Path:
        """SB3's `model.save(path)`: the agent as the run ended (its policy: config, networks, observation statistics)
        written to exactly `path`; `rlcli.load(path)` reads it back in any process. Training goes on from the run
        directory, which also holds the optimizer and buffer: `rlcli.train(resume=run.run_dir, more_steps=n)`."""
        return self.agent.save(path)


def train(overrides: Sequence[str] | str | Mapping[str, Any] | None = None, *, env: EnvSource | None = None,
          callbacks: Sequence[Callback] = (), resume: str | Path | None = None, run_dir: str | Path | None = None,
          more_steps: int | None = None, policy_kwargs: Mapping[str, Any] | None = None, **settings: Any) -> Run:
    """Train as `rl-train <overrides>` would, and return the run.

    `overrides`: rl-train's command-line overrides (`["algo=sac", "algo.lr=1e-3"]`, one string of them, or a dict
    of them: `{"algo": "sac", "algo.lr": 1e-3}`).
    `settings`: the same as keyword arguments, a section as a dict: `algo="sac", train={"total_steps": 5000},
    seed=3`. `env`: an env config name (`"CartPole-v1"`), any registered gymnasium id (`"Taxi-v3"`), or a
    function that makes the env (`lambda: MyEnv(size=5)`). A function's env is registered under
    `rlcli-python/<function name>-v0` in this process only, so `rl-train resume=` from the shell cannot rebuild
    it: resume it from Python with the same `env=`. An env instance (`gymnasium.make(...)` or your own) or a
    gymnasium VectorEnv works too: rlcli makes its training and test envs the way yours was made (its id when it
    is a registered one with its defaults, else copies of it; a VectorEnv also sets train.num_envs); yours is not
    stepped. `callbacks`: rlcli.Callback instances called at the loop's points; one may stop the run cleanly (it
    stays resumable). `resume`: a run directory or checkpoint (or "auto" with `run_dir=`), as `resume=` on the
    command line. `more_steps`: with `resume`, train this many env steps beyond the checkpoint's (SB3's
    `learn(n, reset_num_timesteps=False)`), instead of an absolute train.total_steps. `run_dir`: where the run
    goes (hydra.run.dir; by default runs/<algo>/<env>/<time stamp> under the current directory). `dataset="..."`
    (a dataset's path or Minari id) makes it an offline run, as `rl-train dataset=...` (docs/guide/offline.md).
    `policy_kwargs`: SB3's network settings (net_arch, activation_fn, ortho_init, log_std_init, ...) as rlcli's
    actor keys. A keyword that is not a top-level setting but one of the algorithm's (`n_steps=64`,
    `learning_rate=1e-3`) is that algorithm's setting, as in SB3's `PPO(..., n_steps=64)`.

    Raises RlcliError for bad input or a failed run (divergence, a failing env, a full disk); a Ctrl-C stops at the
    end of the iteration with a checkpoint saved and raises KeyboardInterrupt.
    """
    from rlcli.entry.api_habits import actor_keys, algo_keywords, function_name, more_steps_overrides, vector_num_envs
    from rlcli.entry.rl_train import run_from_python
    from rlcli.registry import ConfigError
    from rlcli.run.callbacks import CallbackList
    from rlcli.run.stop import RunFailed, StopNow, StoppedBySignal

    CallbackList(callbacks)  # a wrong kind is a TypeError now, before anything is made
    _check_sections(settings)
    given = _as_list(overrides)
    settings = algo_keywords(settings, given)
    if policy_kwargs is not None:
        actor = settings.get("actor")
        chosen = {"name": actor} if isinstance(actor, str) else dict(actor or {})
        settings = {**settings, "actor": {**actor_keys(policy_kwargs), **chosen}}
    args = [*given, *env_overrides(env), *as_overrides(settings)]
    num_envs = vector_num_envs(env)
    if num_envs is not None and not any(a.split("=", 1)[0] == "train.num_envs" for a in args):
        args.append(f"train.num_envs={num_envs}")
    if run_dir is not None:
        args.append(f"hydra.run.dir={_format_value(str(Path(run_dir).expanduser()))}")
    if more_steps is not None:
        args += more_steps_overrides(more_steps, resume, run_dir, args)
    if resume is not None:
        args.append(f"resume={_format_value(str(resume))}")
    try:
        trainer = run_from_python(args, callbacks)
    except ConfigError as error:  # its lines name the command line's keys; run_dir= is hydra.run.dir there
        raise RlcliError(str(error).replace("hydra.run.dir", "run_dir")) from None
    except RunFailed as failed:
        raise RlcliError(failed.message) from failed.__context__
    except (StoppedBySignal, StopNow) as stopped:
        again = f", env={function_name(env)}" if env is not None and not isinstance(env, str) else ""
        how = ("training stopped at once, without a new checkpoint (a second signal, or the next safe point was "
               "too far away); continue from its last one with" if isinstance(stopped, StopNow) else
               "training stopped with a checkpoint saved; continue it with")
        raise KeyboardInterrupt(f"{how} rlcli.train(resume=<its run dir>{again})") from None
    state = trainer.state
    return Run(Path(trainer.run_dir), state.env_steps, state.last_test_return, state.best_test_return,
               str(trainer.stop_reason), bool(state.finished))


def _check_sections(settings: Mapping[str, Any]) -> None:
    """A section of the config (train, log, sweep) given as one value (`train=1000`) would reach OmegaConf as an
    override that replaces the whole section; say what a section takes instead."""
    import yaml

    from rlcli.run.compose import conf_dir

    config = yaml.safe_load((Path(conf_dir()) / "config.yaml").read_text()) or {}
    sections = sorted(k for k, v in config.items() if isinstance(v, dict))
    for key, value in settings.items():
        if key in sections and not isinstance(value, Mapping):
            example = {"train": "{'total_steps': 100_000}", "log": "{'console': False}"}.get(key, "{'<key>': <value>}")
            raise InvalidType(f"{key}={value!r}: {key} is a section of settings, not a value; give a dict of its keys, "
                              f"e.g. {key}={example} (sections: {', '.join(sections)})")


def as_overrides(settings: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Keyword arguments as rl-train overrides: `train={"total_steps": 5000}` -> `train.total_steps=5000`; a string
    value of a section key (`algo="sac"`) is its group choice."""
    args = []
    for key, value in settings.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            if not value:
                raise RlcliError(f"{name}={{}} is empty: give the keys to set, e.g. {name}={{'key': value}}")
            if not prefix and key in _NAMED_GROUPS and isinstance(value.get("name"), str):
                # algo={"name": "ppo", "n_steps": 64}: the choice, then its settings (algo.name= alone would keep
                # the default algorithm's other settings)
                args.append(f"{name}={_format_value(value['name'])}")
                value = {k: v for k, v in value.items() if k != "name"}
                if not value:
                    continue
            args += as_overrides(value, prefix=f"{name}.")
        else:
            args.append(f"{name}={_format_value(value)}")
    return args


_NAMED_GROUPS = ("algo", "actor", "buffer", "collector")


def _format_value(value: Any) -> str:
    """A Python value in Hydra's override grammar."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(_format_value(v) for v in value) + "]"
    text = str(value)
    if re.fullmatch(r"[\w./:@+-]+", text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _as_list(overrides: Sequence[str] | str | Mapping[str, Any] | None) -> list[str]:
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):  # {"algo": "ppo", "train.total_steps": 256}: as keyword settings
        return as_overrides(overrides)
    if isinstance(overrides, str):
        import shlex

        return shlex.split(overrides)
    return [str(o) for o in overrides]


def env_overrides(env: EnvSource | None) -> list[str]:
    """`env=` as rl-train overrides: a shipped config (`env=CartPole-v1`), a gymnasium id, or a function's env
    registered for this process (an instance or a VectorEnv first becomes one of those: api_habits.env_source)."""
    from rlcli.entry.api_habits import env_source

    if env is None:
        return []
    env = env_source(env)
    if isinstance(env, str):
        from rlcli.run.compose import conf_dir

        shipped = Path(conf_dir()) / "env"
        if (shipped / f"{env}.yaml").is_file() or (shipped / env).is_dir() or env == "gym":
            return [f"env={env}"]
        return ["env=gym", f"env.id={_format_value(env)}"]
    import gymnasium

    if hasattr(env, "possible_agents"):  # a PettingZoo env instance
        raise InvalidType(f"env={type(env).__name__}(...) is a PettingZoo env instance, and rlcli makes its own copies "
                          "of the env (and again on resume): pass the function that makes one, e.g. env=lambda: "
                          "simple_spread_v3.parallel_env(N=3)")
    if not callable(env):
        raise InvalidType(f"env={env!r} is neither an env name, a function that makes an env, an env instance nor a "
                          "gymnasium VectorEnv")
    name = re.sub(r"[^\w.-]", "_", getattr(env, "__name__", type(env).__name__))
    if makes_pettingzoo_env(env):  # a multi-agent env: env=pz, whose env.id is module:function
        from rlcli.envs import PYTHON_MADE, python_made

        base = re.sub(r"\W", "_", name if name != "_lambda_" else "env")
        names = itertools.chain([base], (f"{base}_{i}" for i in itertools.count(2)))
        name = next(n for n in names if python_made.MAKERS.setdefault(n, env) is env)  # another function: its own id
        return ["env=pz", f"env.id={PYTHON_MADE}{name}"]
    env_id = f"rlcli-python/{'env' if name == '_lambda_' else name}-v0"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # registering the id again (a second train() call) replaces it
        gymnasium.register(env_id, entry_point=env)
    return ["env=gym", f"env.id={env_id}"]


_PETTINGZOO_MAKERS: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def makes_pettingzoo_env(make: Any) -> bool:
    """Whether a function makes a PettingZoo env (Parallel or AEC: it has possible_agents), found by making one, once
    per function. One that needs arguments (given as env.kwargs) is a gymnasium env's function, as it always was."""
    try:
        known = _PETTINGZOO_MAKERS.get(make)
    except TypeError:  # (an object that takes no weak reference)
        known = None
    if known is not None:
        return known
    try:
        required = [p for p in inspect.signature(make).parameters.values() if p.default is p.empty
                    and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    except (TypeError, ValueError):  # (no signature to read: try it)
        required = []
    if required:
        return False
    try:
        made = make()
    except Exception as error:  # noqa: BLE001  (the user's function: its own failure, said in one line)
        raise InvalidValue(f"env={getattr(make, '__name__', make)!r}: calling it to make the env failed: "
                           f"{type(error).__name__}: {error}") from None
    pettingzoo = hasattr(made, "possible_agents")
    close = getattr(made, "close", None)
    if callable(close):
        close()
    with contextlib.suppress(TypeError):
        _PETTINGZOO_MAKERS[make] = pettingzoo
    return pettingzoo


# ---------------------------------------------------------------------------------------- load and act
class Policy:
    """A trained agent that acts on raw env observations; normalization and action rescaling are inside.

    Made by rlcli.load(); `predict` is SB3's: (action, state) for one observation or a batch."""

    def __init__(self, loaded: Loaded) -> None:
        self._loaded = loaded
        agent = loaded.agent
        self.checkpoint: Path = loaded.path
        self.algo_name: str = str(loaded.cfg.algo.name)
        self.env_id: str = str(loaded.env_factory.spec.id)
        self.device: Any = loaded.device
        self.recurrent: bool = agent.carry_size > 0
        self.needs_action_mask: bool = bool(agent.spec.action_masks)

    @property
    def config(self) -> Any:
        """The run's config (an OmegaConf DictConfig), as its checkpoint holds it."""
        return self._loaded.cfg

    @property
    def networks(self) -> Any:
        """The torch modules (an nn.Module): parameters, `state_dict()`, `to(device)`."""
        return self._loaded.agent.algo.networks

    def predict(self, obs: Any, state: Any = None, episode_start: Any = None,
                deterministic: bool = True, action_mask: Any = None
                ) -> tuple[np.ndarray | dict[str, Any], np.ndarray | dict[str, Any] | None]:
        """The env action(s) for `obs` (one observation, or a batch with a leading dimension) and the next recurrent
        state (None for a feed-forward policy). A recurrent policy takes the state it returned last; `state=None` or
        `episode_start` true for an entry starts that entry's episode afresh. Masked policies (maskable_ppo) need
        `action_mask`: True for the valid actions (a row of all False, a waiting player's, gets action 0, which the
        env ignores).

        A multi-agent run (env=pz) also takes PettingZoo's dict {agent: observation} and gives {agent: action}, for
        `env.step(actions)`: one action for each agent of the dict (the state too is a dict by agent). After an
        agent's last step PettingZoo's dict still holds its final observation: pass `{a: obs[a] for a in env.agents}`
        to act for the agents still in the episode alone."""
        if isinstance(obs, Mapping) and self._agent_rows is not None:
            return self._predict_agents(obs, self._agent_rows, state, episode_start, deterministic, action_mask)
        return self._predict_rows(obs, state, episode_start, deterministic, action_mask)

    def _predict_rows(self, obs: Any, state: np.ndarray | None, episode_start: Any, deterministic: bool,
                      action_mask: Any) -> tuple[np.ndarray, np.ndarray | None]:
        """`predict` of one observation or a batch, as the run's envs give them."""
        import numpy as np
        import torch

        from rlcli.contracts import RecurrentState

        agent, device = self._loaded.agent, self.device
        observation_space = self._observation_space
        raw = self._raw_observations(obs)
        if raw is not None:  # the env's own observation (a dict, FrozenLake's integer): encoded as rlcli's envs do
            x, single = raw
        else:
            if isinstance(obs, Mapping):
                raise RlcliError(f"obs is a dict but {self.env_id}'s observations are not: give one {self.env_id} "
                                 "observation or a batch of them")
            x = _real_observations(obs, self.env_id)
            single = x.shape == tuple(observation_space.shape)
        if not single and x.shape[1:] != tuple(observation_space.shape):
            agents = "" if self._agent_rows is None else "; or a dict {agent: observation}, as PettingZoo gives them"
            raise RlcliError(f"obs of shape {x.shape} does not fit {self.env_id}'s observations of shape "
                             f"{tuple(observation_space.shape)} (or a batch of them, [n, "
                             f"{', '.join(map(str, observation_space.shape))}]){agents}")
        batch = x[None] if single else x
        n = len(batch)
        with torch.inference_mode():
            tensor = agent.algo.networks.normalizer(torch.as_tensor(batch, dtype=agent.obs_dtype, device=device))
            recurrent = None
            if self.recurrent:
                carry = torch.zeros(n, agent.carry_size, device=device) if state is None else \
                    torch.as_tensor(np.asarray(state, dtype=np.float32).reshape(n, agent.carry_size), device=device)
                starts = np.ones(n) if state is None else np.broadcast_to(
                    np.asarray(False if episode_start is None else episode_start, dtype=np.float32), (n,)).copy()
                recurrent = RecurrentState(carry, torch.as_tensor(starts, dtype=torch.float32, device=device))
            if self.needs_action_mask:
                if action_mask is None:
                    raise RlcliError(f"algo={self.algo_name} acts among the valid actions: pass action_mask= (True "
                                     "for each valid action; the env's info['action_mask'])")
                mask = torch.as_tensor(np.asarray(action_mask, dtype=bool).reshape(n, -1), device=device)
                out = agent.algo.act_masked(tensor, mask, deterministic=deterministic)
            else:
                out = agent.algo.act(tensor, deterministic=deterministic, state=recurrent)
            actions = agent.algo.env_actions(out.actions).cpu().numpy()
        next_state = None if out.carry is None else out.carry.cpu().numpy()
        if single:
            return actions[0], None if next_state is None else next_state[0]
        return actions, next_state

    @cached_property
    def _agent_rows(self) -> AgentRows | None:
        """A multi-agent run's (env=pz, env=vmas) rows, as its envs make them from each agent's observation; else
        None."""
        if str(self._loaded.cfg.env.get("name")) not in ("pz", "vmas"):
            return None
        import numpy as np

        from rlcli.envs.multiagent import AgentRowsEnv, ObservationLayout
        from rlcli.envs.turn_based import TurnBasedVectorEnv

        probe = self.make_env()
        try:
            vec = probe
            while not isinstance(vec, AgentRowsEnv | TurnBasedVectorEnv):
                vec = getattr(vec, "env", None)
                if vec is None:
                    raise RlcliError(f"predict does not take {self.env_id}'s observations as a dict of agents")
            if isinstance(vec, TurnBasedVectorEnv):  # self-play: every player's row, its one-hot, its legal moves
                players, game = list(vec.players), vec.copies[0]
                return AgentRows(players, players, {},
                                 {p: ObservationLayout(game.observation_space(p), p, self.env_id) for p in players},
                                 {p: np.ones(vec.n_actions, bool) for p in players} if vec.has_masks else None,
                                 vec.has_masks and not vec.dict_obs, vec.own_size, vec.agent_id,
                                 vec.own_size + (vec.n_players if vec.agent_id else 0))
            act_space = vec.agent_spaces(vec.agent_names[0])[1]
            masks = None if not vec.has_masks else dict(zip(vec.agent_names, vec._valid, strict=True))
            return AgentRows(list(vec.agent_names), list(vec.possible_agents),
                             {name: vec.noop(vec.agent_spaces(name)[1]) for name in vec.others},
                             dict(zip(vec.agent_names, vec.obs_layouts, strict=True)), masks,
                             bool(getattr(vec, "info_masks", False)), vec.own_size, vec.agent_id,
                             int((vec.single_observation_space.shape or (0,))[-1]) if vec.joint
                             else int(np.prod(vec.single_observation_space.shape or ())), vec.joint,
                             tuple(act_space.shape or ()))
        finally:
            probe.close()

    def _predict_agents(self, obs: Mapping[Any, Any], rows: AgentRows, state: Any, episode_start: Any,
                        deterministic: bool, action_mask: Any = None) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """`predict` of PettingZoo's dict of observations: each agent of the run's group acts on its row (its own
        observation, its one-hot; a centralized critic's global state is left zero: the policy never reads it);
        agents outside the group get what training gave them, nothing (action 0, a zero vector)."""
        import numpy as np

        unknown = [k for k in obs if k not in rows.possible]
        if unknown:
            raise InvalidValue(f"obs has the key {unknown[0]!r}, not an agent of {self.env_id}; its agents: "
                               f"{', '.join(map(str, rows.possible))}")
        if isinstance(action_mask, Mapping) and (stray := [k for k in action_mask if k not in obs]):
            raise InvalidValue(f"action_mask has the key {stray[0]!r}, which obs does not: give each acting agent's "
                               f"mask under its name ({', '.join(map(str, obs)) or 'none in obs'})")
        acting = [name for name in rows.names if name in obs]
        x = np.zeros((len(acting), rows.row_size), np.float32)
        masks = None if rows.valid is None else np.stack([rows.valid[name] for name in acting] or [np.ones(0, bool)])
        for k, name in enumerate(acting):
            own, mask = self._agent_observation(obs[name], name, rows)
            x[k, :own.size] = own.reshape(-1)  # an agent observing fewer inputs leaves the rest 0, as in training
            if masks is not None:
                masks[k] &= self._agent_mask(mask, action_mask, name, rows, int(masks[k].sum()))
            if rows.agent_id:
                x[k, rows.own_size + rows.names.index(name)] = 1.0
        actions: dict[str, Any] = {name: noop for name, noop in rows.others.items() if name in obs}
        if not acting:
            return actions, ({} if self.recurrent else None)
        if rows.joint:  # one joint observation, the agents of the dict active, the rest not (their actions unused)
            lines = np.zeros((len(rows.names), rows.row_size), np.float32)
            active = rows.own_size + (len(rows.names) if rows.agent_id else 0)
            for k, name in enumerate(acting):
                i = rows.names.index(name)
                lines[i], lines[i, active] = x[k], 1.0
            joint, _ = self._predict_rows(lines, None, None, deterministic, None)
            picked = {name: joint[rows.names.index(name)] for name in acting}
            actions.update({name: a.reshape(rows.action_shape) if rows.action_shape else a
                            for name, a in picked.items()})
            return actions, None
        carry, starts = None, None
        if self.recurrent:  # per agent: its carry from the last call, or a fresh one (an agent absent from `state`)
            if state is not None and not isinstance(state, Mapping):
                raise InvalidType("state: with a dict of observations, give the dict of states that predict returned")
            known = state or {}
            size = self._loaded.agent.carry_size
            carry = np.stack([np.asarray(known[n], np.float32).reshape(size) if n in known
                              else np.zeros(size, np.float32) for n in acting])
            begin = episode_start if isinstance(episode_start, Mapping) else {n: episode_start for n in acting}
            starts = np.array([n not in known or bool(begin.get(n) or False) for n in acting])
        out, next_state = self._predict_rows(x, carry, starts, deterministic,
                                             masks if self.needs_action_mask else None)
        actions.update({name: out[k] for k, name in enumerate(acting)})
        if next_state is None:
            return actions, None
        return actions, {name: next_state[k] for k, name in enumerate(acting)}

    def _agent_observation(self, obs: Any, name: str, rows: AgentRows) -> tuple[np.ndarray, np.ndarray | None]:
        """Agent `name`'s observation as its row's numbers (as its env writes them), and the mask it holds."""
        import gymnasium as gym

        layout = rows.layouts[name]
        if isinstance(layout.space, gym.spaces.Box):
            own = _real_observations(obs, self.env_id)
            if own.shape != tuple(layout.space.shape):
                raise InvalidValue(f"obs[{name!r}] has the shape {own.shape}; agent {name!r} of {self.env_id} "
                                   f"observes {tuple(layout.space.shape)} (give one observation per agent)")
            return own, None
        try:
            flat, mask = layout.split(obs)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError):
            raise InvalidValue(f"obs[{name!r}] is not an observation of agent {name!r} of {self.env_id}, which "
                               f"observes {layout.space}") from None
        return _real_observations(flat, self.env_id), mask

    @staticmethod
    def _agent_mask(held: np.ndarray | None, given: Any, name: str, rows: AgentRows, size: int) -> np.ndarray:
        """Agent `name`'s valid actions among the rows' (its own first): from its observation, else from
        `action_mask` ({agent: mask}), else all of its own where its env gives masks only in the observation."""
        import numpy as np

        mask = held
        if given is not None and not isinstance(given, Mapping):
            raise InvalidType("action_mask: with a dict of observations, give a dict {agent: mask} (True for each "
                              "valid action)")
        if isinstance(given, Mapping) and name in given:
            mask = np.asarray(given[name], bool).reshape(-1)
        elif mask is None and rows.info_masks:
            raise InvalidValue(f"agent {name!r}'s valid actions are in its info: pass action_mask={{agent: "
                               "infos[agent]['action_mask']}")
        full = np.ones(len(rows.valid[name]) if rows.valid else size, bool)
        if mask is not None:
            if mask.shape != (size,):
                raise InvalidValue(f"action_mask for agent {name!r} has the shape {mask.shape}; it has {size} actions")
            full[:size] = mask
        return full

    def save(self, path: str | Path) -> Path:
        """SB3's `model.save(path)`: this policy (its config, networks and observation statistics, in rlcli's
        checksummed checkpoint format) written atomically to exactly `path`, for `rlcli.load(path)` in any process
        (or `actor={"init_from": path}` to start a new run from its weights). It holds no optimizer or buffer:
        training goes on from the run directory (`rlcli.train(resume=<run dir>, more_steps=n)`)."""
        from omegaconf import OmegaConf

        from rlcli.services import checkpoint

        if not isinstance(path, str | PathLike):
            raise InvalidType(f"path={path!r} is not a path; give a file name (a str or a pathlib.Path)")
        target = Path(path).expanduser()
        if target.is_dir():
            raise InvalidValue(f"path={str(target)!r} is a directory; give a file name, e.g. {target / 'agent.pt'}")
        config = OmegaConf.to_container(self._loaded.cfg, resolve=True)
        networks = {k: v.detach().cpu() for k, v in self.networks.state_dict().items()}
        try:
            return checkpoint.write(target, self._loaded.env_steps, {"config": config, "algo": {"networks": networks}})
        except OSError as error:
            raise RlcliError(f"cannot write {target}: {error.strerror or error}") from None

    def make_env(self, num_envs: int = 1, render: bool = False) -> Any:
        """A gymnasium vector env as rlcli makes this policy's test envs (its wrappers, episode statistics; with
        `render`, rgb_array frames): what `predict` takes observations from. Close it when done. `num_envs` counts
        copies of the env, as train.test_episodes does: a multi-agent env's copy is a row per agent (its num_envs is
        the rows), or one row in joint mode."""
        from rlcli.registry import ConfigError

        try:
            return self._loaded.env_factory.make(num_envs, "sync", eval=True, render=render,
                                                 masks=self.needs_action_mask)
        except ConfigError as error:
            raise RlcliError(str(error)) from None

    @cached_property
    def _spaces(self) -> tuple[Any, Any, list[Any]]:
        """The policy's observation space, the env's own (raw) one, and the vector observation wrappers between
        them, innermost first (dict flattening or packing, one-hot encoding, observation_indices)."""
        from gymnasium.vector import VectorObservationWrapper, VectorWrapper

        probe = self.make_env()
        try:
            transforms, env = [], probe
            while isinstance(env, VectorWrapper):
                if isinstance(env, VectorObservationWrapper):
                    transforms.append(env)
                env = env.env
            raw = transforms[-1].env.single_observation_space if transforms else probe.single_observation_space
            return probe.single_observation_space, raw, transforms[::-1]
        finally:
            probe.close()

    @property
    def _observation_space(self) -> Any:
        return self._spaces[0]

    def _raw_observations(self, obs: Any) -> tuple[np.ndarray, bool] | None:
        """`obs` as the env gives it (SB3's `predict` takes those): a Dict observation, a Discrete one (an int), a
        MultiDiscrete or Tuple one, a Box before observation_indices; encoded one by one with the wrappers rlcli's
        envs apply. None: `obs` is already as rlcli's envs give it (or not the env's own either)."""
        import gymnasium
        import numpy as np

        from rlcli.entry.api_habits import as_space_value, batch_of_one, short

        processed, raw, transforms = self._spaces
        if not transforms:
            return None
        items: list[Any]
        if isinstance(raw, gymnasium.spaces.Dict):
            if not isinstance(obs, Mapping):
                return None
            missing = [k for k in raw.spaces if k not in obs]
            if missing:
                raise InvalidValue(f"obs lacks the key(s) {', '.join(map(repr, missing))} of {self.env_id}'s Dict "
                                   f"observation (keys: {', '.join(map(repr, raw.spaces))})")
            values = {k: np.asarray(obs[k]) for k in raw.spaces}
            first = next(iter(raw.spaces))
            single = values[first].shape == tuple(raw.spaces[first].shape or ())
            items = [values] if single else [{k: v[i] for k, v in values.items()} for i in range(len(values[first]))]
        elif isinstance(raw, gymnasium.spaces.Tuple):
            if not isinstance(obs, tuple):
                return None
            single = all(np.ndim(e) == 0 for e in obs)
            items = [obs] if single else list(zip(*obs, strict=True))
        else:
            x = np.asarray(obs)
            shape = tuple(raw.shape or ())
            if isinstance(raw, gymnasium.spaces.Discrete | gymnasium.spaces.MultiDiscrete):
                if x.dtype.kind not in "iu":
                    return None  # floats: rlcli's one-hot observations
            elif shape == tuple(processed.shape) or x.shape[x.ndim - len(shape):] != shape \
                    or x.ndim not in (len(shape), len(shape) + 1):
                return None  # already the policy's observations (or neither: the shape check below names it)
            single = x.shape == shape
            items = [x] if single else list(x)
        encoded = []
        for item in items:
            if not raw.contains(as_space_value(item, raw)):
                raise InvalidValue(f"obs {short(item)} is not a {self.env_id} observation ({raw})")
            batch: Any = batch_of_one(item)
            for wrapper in transforms:  # a batch of one: the wrappers were made for the probe's single env
                batch = wrapper.observations(batch)
            encoded.append(np.asarray(batch)[0])
        return _real_observations(np.stack(encoded), self.env_id), single

    def __repr__(self) -> str:
        return f"Policy({self.algo_name} on {self.env_id}, from {self.checkpoint}, device {self.device})"


@dataclass(frozen=True)
class AgentRows:
    """How a multi-agent run's envs (envs/multiagent.py) make an agent's row: `names` the group's agents (row order),
    `possible` every agent of the env, `others` what the agents outside the group do, each learning agent's
    observation layout and valid actions, the largest observation's size in the row, whether their one-hot follows
    it, and the row's size; in joint mode (one row per copy) the agents' lines of one joint observation, and each
    agent's action shape."""

    names: list[str]
    possible: list[str]
    others: dict[str, Any]
    layouts: dict[str, Any]  # each learner's ObservationLayout (envs/multiagent.py)
    valid: dict[str, np.ndarray] | None  # where rows take masks: each learner's own actions among the rows'
    info_masks: bool  # the env gives its masks in infos (predict's action_mask={agent: mask})
    own_size: int
    agent_id: bool
    row_size: int  # joint mode (env.joint=true): an agent's line of the copy's joint observation
    joint: bool = False
    action_shape: tuple[int, ...] = ()


def _real_observations(obs: Any, env_id: str) -> np.ndarray:
    """`obs` as an array of finite real numbers, or one line saying why not: a NaN, infinite or complex observation
    would otherwise give an action (argmax of NaN is action 0) that means nothing."""
    import numpy as np

    try:
        x = np.asarray(obs)
    except (TypeError, ValueError) as error:  # ragged nested lists
        raise InvalidValue(f"obs is not an array of numbers ({str(error).split('. ')[0]}); give one {env_id} "
                           "observation or a batch of them") from None
    if x.dtype.kind == "c":
        raise InvalidValue(f"obs is complex ({x.dtype}); {env_id}'s observations are real numbers")
    if x.dtype.kind not in "biuf":
        raise InvalidType(f"obs of dtype {x.dtype} is not numbers; give one {env_id} observation or a batch of them")
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        where = tuple(int(i) for i in np.argwhere(~np.isfinite(x))[0])
        raise InvalidValue(f"obs holds a non-finite value ({x[where]} at index {list(where)}); a policy's action "
                           "for it means nothing: check the env or the preprocessing that made it")
    return x


def as_policy(policy: Any, what: str) -> Policy:
    """`policy` if it is one; else one line saying how to make one (a path is the common mistake)."""
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, str | Path):
        raise InvalidType(f"{what}(policy={str(policy)!r}): policy is a path; load it first: "
                          f"{what}(rlcli.load({str(policy)!r}))")
    raise InvalidType(f"{what}(policy={policy!r}): policy must be an rlcli.Policy; make one with "
                      "rlcli.load(<run dir or checkpoint file>)")


def env_id_overrides(env: EnvSource | None) -> list[str]:
    """`env=` of rlcli.load / rlcli.evaluate as an `env.id=` override (a function's env is registered first; an
    instance or a VectorEnv becomes its id or a function first)."""
    from rlcli.entry.api_habits import env_source

    if env is None:
        return []
    env = env_source(env)
    if isinstance(env, str):
        import yaml

        from rlcli.run.compose import conf_dir

        shipped = Path(conf_dir()) / "env" / f"{env}.yaml"  # a shipped config's name (CartPoleNoVel-v1): its id
        if shipped.is_file():
            env = str((yaml.safe_load(shipped.read_text()) or {}).get("id") or env)
        return [f"env.id={env}"]
    return [o for o in env_overrides(env) if o.startswith("env.id=")]


def load(path: str | Path, load: LoadWhich = "best", device: str = "cpu", trusted_checkpoint: bool = False,
         env: EnvSource | None = None) -> Policy:
    """The policy in a run directory (`load`: best, last, or a checkpoint's env steps) or in a checkpoint file,
    rebuilt from the checkpoint's own config on `device`. Reading it runs no code from the file: a format-1
    (pickle) checkpoint of an older rlcli is read only with trusted_checkpoint=True, and an env id that imports
    a module (`mymodule:MyEnv-v0`) is built only when you name it again, `env="mymodule:MyEnv-v0"` (or pass
    trusted_checkpoint=True). `env`: another env id with the same spaces, a function that makes the env, an env
    instance or a VectorEnv. A run trained on `rlcli.train(env=<function>)` needs that function again here in a new
    process (`rlcli.load(path, env=make_env)`): the function lives in the process that trained it. `path` may also
    be a file written by `Policy.save` / `Run.save`."""
    from rlcli.entry.run_loading import checkpoint_of, is_run_dir, load_agent
    from rlcli.registry import ConfigError
    from rlcli.services import checkpoint

    if not isinstance(path, str | PathLike):
        raise InvalidType(f"path={path!r} is not a path; give a run directory or a checkpoint file (a str or a "
                          "pathlib.Path)")
    if not (load in ("best", "last") or (isinstance(load, int) and not isinstance(load, bool) and load >= 0)):
        raise InvalidValue(f"load={load!r} is invalid: use 'best', 'last' or a checkpoint's env steps (an int >= 0)")
    if not isinstance(trusted_checkpoint, bool):
        raise InvalidType(f"trusted_checkpoint={trusted_checkpoint!r} must be True or False")
    target = Path(path).expanduser()
    try:
        if target.is_file():
            file = target
        elif target.is_dir() and is_run_dir(target):
            file = checkpoint_of(target, str(load), warn=lambda message: warnings.warn(message, stacklevel=4))
        elif target.is_dir():
            raise InvalidValue(f"{target} is a directory but not a run directory (no .hydra/overrides.yaml, no "
                               "checkpoints/); give a run directory or a checkpoint file")
        else:
            raise NotFound(f"{target}: no such run directory or checkpoint file")
        loaded = load_agent(file, {"device": device, "trusted_checkpoint": trusted_checkpoint, "seed": None,
                                  "configure_torch": False, "caller": "python"}, env_id_overrides(env))
    except (ConfigError, checkpoint.CheckpointError) as error:
        raise RlcliError(str(error)) from None
    return Policy(loaded)
