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

import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rlcli.run.callbacks import Callback

if TYPE_CHECKING:
    import numpy as np

    from rlcli.entry.run_loading import Loaded

LoadWhich = Literal["best", "last"] | int


class RlcliError(Exception):
    """Bad input (a config value, a path, a checkpoint) or a run that failed; the message is one line saying what is
    wrong and what would work, as rl-train and rl-eval print it."""


class InvalidValue(RlcliError, ValueError):
    """A value rlcli cannot use (a NaN observation, a section given as a number): an RlcliError and a ValueError, so
    either `except` catches it."""


class InvalidType(RlcliError, TypeError):
    """An argument of the wrong kind (a number for a path, a path for a Policy): an RlcliError and a TypeError."""


class NotFound(RlcliError, FileNotFoundError):
    """No run directory or checkpoint file at the path given: an RlcliError and a FileNotFoundError."""


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


def train(overrides: Sequence[str] | str | None = None, *, env: str | Callable[..., Any] | None = None,
          callbacks: Sequence[Callback] = (), resume: str | Path | None = None, run_dir: str | Path | None = None,
          **settings: Any) -> Run:
    """Train as `rl-train <overrides>` would, and return the run.

    `overrides`: rl-train's command-line overrides (`["algo=sac", "algo.lr=1e-3"]`, or one string of them).
    `settings`: the same as keyword arguments, a section as a dict: `algo="sac", train={"total_steps": 5000},
    seed=3`. `env`: an env config name (`"CartPole-v1"`), any registered gymnasium id (`"Taxi-v3"`), or a
    function that makes the env (`lambda: MyEnv(size=5)`). A function's env is registered under
    `rlcli-python/<function name>-v0` in this process only, so `rl-train resume=` from the shell cannot rebuild
    it: resume it from Python with the same `env=`. `callbacks`: rlcli.Callback instances called at the loop's
    points; one may stop the run cleanly (it stays resumable). `resume`: a run directory or checkpoint (or "auto"
    with `run_dir=`), as `resume=` on the command line. `run_dir`: where the run goes (hydra.run.dir; by default
    runs/<algo>/<env>/<time stamp> under the current directory).

    Raises RlcliError for bad input or a failed run (divergence, a failing env, a full disk); a Ctrl-C stops at the
    end of the iteration with a checkpoint saved and raises KeyboardInterrupt.
    """
    from rlcli.entry.rl_train import run_from_python
    from rlcli.registry import ConfigError
    from rlcli.run.callbacks import CallbackList
    from rlcli.run.stop import RunFailed, StopNow, StoppedBySignal

    CallbackList(callbacks)  # a wrong kind is a TypeError now, before anything is made
    _check_sections(settings)
    args = [*_as_list(overrides), *env_overrides(env), *as_overrides(settings)]
    if run_dir is not None:
        args.append(f"hydra.run.dir={_format_value(str(Path(run_dir).expanduser()))}")
    if resume is not None:
        args.append(f"resume={_format_value(str(resume))}")
    try:
        trainer = run_from_python(args, callbacks)
    except ConfigError as error:
        raise RlcliError(str(error)) from None
    except RunFailed as failed:
        raise RlcliError(failed.message) from failed.__context__
    except (StoppedBySignal, StopNow):
        raise KeyboardInterrupt("training stopped with a checkpoint saved; continue it with "
                                "rlcli.train(resume=<its run dir>)") from None
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
            args += as_overrides(value, prefix=f"{name}.")
        else:
            args.append(f"{name}={_format_value(value)}")
    return args


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


def _as_list(overrides: Sequence[str] | str | None) -> list[str]:
    if overrides is None:
        return []
    if isinstance(overrides, str):
        import shlex

        return shlex.split(overrides)
    return [str(o) for o in overrides]


def env_overrides(env: str | Callable[..., Any] | None) -> list[str]:
    if env is None:
        return []
    if isinstance(env, str):
        from rlcli.run.compose import conf_dir

        shipped = Path(conf_dir()) / "env"
        if (shipped / f"{env}.yaml").is_file() or (shipped / env).is_dir() or env == "gym":
            return [f"env={env}"]
        return ["env=gym", f"env.id={_format_value(env)}"]
    import gymnasium

    if isinstance(env, gymnasium.Env):
        kind = type(env.unwrapped).__name__
        raise RlcliError(f"env={kind}(...) is an env instance; rlcli makes train.num_envs training envs and its test "
                         f"envs from it: pass a function that makes one, e.g. env=lambda: {kind}(...)")
    if not callable(env):
        raise RlcliError(f"env={env!r} is neither an env name nor a function that makes an env")
    name = re.sub(r"[^\w.-]", "_", getattr(env, "__name__", type(env).__name__))
    env_id = f"rlcli-python/{'env' if name == '_lambda_' else name}-v0"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # registering the id again (a second train() call) replaces it
        gymnasium.register(env_id, entry_point=env)
    return ["env=gym", f"env.id={env_id}"]


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

    def predict(self, obs: Any, state: np.ndarray | None = None, episode_start: Any = None,
                deterministic: bool = True, action_mask: Any = None) -> tuple[np.ndarray, np.ndarray | None]:
        """The env action(s) for `obs` (one observation, or a batch with a leading dimension) and the next recurrent
        state (None for a feed-forward policy). A recurrent policy takes the state it returned last; `state=None` or
        `episode_start` true for an entry starts that entry's episode afresh. Masked policies (maskable_ppo) need
        `action_mask`: True for the valid actions."""
        import numpy as np
        import torch

        from rlcli.contracts import RecurrentState

        agent, device = self._loaded.agent, self.device
        observation_space = self._observation_space
        if isinstance(obs, Mapping):
            raise RlcliError(f"obs is a dict; this policy acts on {self.env_id}'s observations as rlcli's envs give "
                             "them (dicts flattened): policy.make_env() makes such an env")
        x = _real_observations(obs, self.env_id)
        single = x.shape == tuple(observation_space.shape)
        if not single and x.shape[1:] != tuple(observation_space.shape):
            raise RlcliError(f"obs of shape {x.shape} does not fit {self.env_id}'s observations of shape "
                             f"{tuple(observation_space.shape)} (or a batch of them, [n, "
                             f"{', '.join(map(str, observation_space.shape))}])")
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

    def make_env(self, num_envs: int = 1, render: bool = False) -> Any:
        """A gymnasium vector env as rlcli makes this policy's test envs (its wrappers, episode statistics; with
        `render`, rgb_array frames): what `predict` takes observations from. Close it when done."""
        from rlcli.registry import ConfigError

        try:
            return self._loaded.env_factory.make(num_envs, "sync", eval=True, render=render,
                                                 masks=self.needs_action_mask)
        except ConfigError as error:
            raise RlcliError(str(error)) from None

    @cached_property
    def _observation_space(self) -> Any:
        probe = self.make_env()
        try:
            return probe.single_observation_space
        finally:
            probe.close()

    def __repr__(self) -> str:
        return f"Policy({self.algo_name} on {self.env_id}, from {self.checkpoint}, device {self.device})"


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


def env_id_overrides(env: str | Callable[..., Any] | None) -> list[str]:
    """`env=` of rlcli.load / rlcli.evaluate as an `env.id=` override (a function's env is registered first)."""
    if env is None:
        return []
    if isinstance(env, str):
        import yaml

        from rlcli.run.compose import conf_dir

        shipped = Path(conf_dir()) / "env" / f"{env}.yaml"  # a shipped config's name (CartPoleNoVel-v1): its id
        if shipped.is_file():
            env = str((yaml.safe_load(shipped.read_text()) or {}).get("id") or env)
        return [f"env.id={env}"]
    return [o for o in env_overrides(env) if o.startswith("env.id=")]


def load(path: str | Path, load: LoadWhich = "best", device: str = "cpu", trusted_checkpoint: bool = False,
         env: str | Callable[..., Any] | None = None) -> Policy:
    """The policy in a run directory (`load`: best, last, or a checkpoint's env steps) or in a checkpoint file,
    rebuilt from the checkpoint's own config on `device`. Reading it runs no code from the file: a format-1
    (pickle) checkpoint of an older rlcli is read only with trusted_checkpoint=True, and an env id that imports
    a module (`mymodule:MyEnv-v0`) is built only when you name it again, `env="mymodule:MyEnv-v0"` (or pass
    trusted_checkpoint=True). `env`: another env id with the same spaces, or a function that makes the env."""
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
