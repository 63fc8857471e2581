"""rlcli from Python, after training: evaluate a loaded policy the way rl-eval does, or export it as a checked
standalone file (rlcli.evaluate, rlcli.export; api.py trains and loads)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rlcli.entry.api import InvalidType, InvalidValue, Policy, RlcliError, as_policy, env_id_overrides

if TYPE_CHECKING:
    from rlcli.entry.run_loading import Loaded


@dataclass
class Evaluation:
    """Per-episode returns and lengths, as rl-eval computes them (episode i starts from seed `seed + i`)."""

    returns: list[float]
    lengths: list[int]
    videos: list[Path] = field(default_factory=list)
    # a multi-agent run (env=pz): each agent's return per episode; `returns` are their sums (never divided)
    agent_returns: dict[str, list[float]] | None = None

    @property
    def mean_return(self) -> float:
        return sum(self.returns) / len(self.returns)

    @property
    def std_return(self) -> float:
        mean = self.mean_return
        return (sum((r - mean) ** 2 for r in self.returns) / len(self.returns)) ** 0.5


def evaluate(policy: Policy, env: str | Callable[..., Any] | None = None, episodes: int = 10, seed: int = 0,
             deterministic: bool = True, num_envs: int | None = None, video: bool = False,
             video_format: Literal["mp4", "gif"] = "mp4") -> Evaluation:
    """Run `episodes` episodes of `policy` on its own env (or on `env`: another id, or a function that makes
    an env with the same spaces) the way rl-eval does. `video=True` also records the first episode to
    `<run dir>/videos/` (needs pip install -e '.[video]')."""
    from rlcli.entry.checked_envs import EnvFailed
    from rlcli.entry.rl_eval import evaluate_checkpoint
    from rlcli.registry import ConfigError
    from rlcli.services import video as videos

    policy = as_policy(policy, "rlcli.evaluate")
    for name, value in (("episodes", episodes), ("seed", seed), ("num_envs", num_envs)):
        if not (isinstance(value, int) and not isinstance(value, bool)) and not (name == "num_envs" and value is None):
            raise InvalidType(f"{name}={value!r} must be an int")
    if episodes < 1 or (num_envs is not None and num_envs < 1):
        raise InvalidValue(f"episodes={episodes} and num_envs={num_envs} must be >= 1")
    if not 0 <= seed < 2**32:
        raise InvalidValue(f"seed={seed} is invalid: must be between 0 and 2**32 - 1")
    loaded = policy._loaded
    try:
        if env is not None:
            loaded = _on_env(loaded, env)
        if video:
            videos.require_encoder(video_format)
        options = {"episodes": episodes, "num_envs": num_envs, "seed": seed, "deterministic": deterministic,
                   "video": video, "video_episodes": 1, "video_format": video_format, "video_concat": False}
        name = f"python-{loaded.path.stem}"  # videos/python-best-ep0-return<R>.mp4
        result, recordings = evaluate_checkpoint(loaded, options, name)
    except ConfigError as error:
        raise RlcliError(str(error)) from None
    except EnvFailed as error:  # the env's own exception stays attached: it is the user's env's bug to read
        raise RlcliError(str(error)) from error.__cause__
    return Evaluation(result.returns, result.lengths, [r.path for r in recordings], result.agent_returns)


def _on_env(loaded: Loaded, env: str | Callable[..., Any]) -> Loaded:
    """The same agent, acting on another env id (its spaces must be the same)."""
    from dataclasses import replace

    from omegaconf import OmegaConf

    from rlcli.algos.agent import section
    from rlcli.registry import ENVS

    overrides = env_id_overrides(env)
    cfg = OmegaConf.merge(loaded.cfg, OmegaConf.from_dotlist(overrides))
    factory = ENVS.build(section(cfg, "env"))
    return replace(loaded, cfg=cfg, env_factory=factory)


def export(policy: Policy, format: Literal["onnx", "torchscript"] = "onnx") -> Path:
    """Write the policy as a standalone file (observation in, env action out; a recurrent policy: carry in and
    out) to `<run dir>/export/`, check it against rlcli's actions, and return its path (rl-eval export=...)."""
    from rlcli.entry.checked_envs import EnvFailed
    from rlcli.entry.export_check import export_policy
    from rlcli.registry import ConfigError
    from rlcli.services import policy_export as exporting

    policy = as_policy(policy, "rlcli.export")
    try:
        if format not in exporting.FORMATS:
            raise ConfigError(f"format={format!r} is not an export format; choose from: {', '.join(exporting.FORMATS)}")
        if format == "onnx":
            exporting.require("onnx", "onnxscript", "onnxruntime")
        loaded = policy._loaded
        path, difference, their_return, our_return = export_policy(loaded, format, loaded.path.stem, seed=0)
    except ConfigError as error:
        raise RlcliError(str(error)) from None
    except EnvFailed as error:
        raise RlcliError(str(error)) from error.__cause__
    if difference > 1e-5 or abs(their_return - our_return) > 1e-4 * max(1.0, abs(our_return)):
        raise RlcliError(f"{path} does not act as rlcli does: actions differ by up to {difference:.2g}, episode return "
                         f"{their_return:g} against {our_return:g}")
    return path
