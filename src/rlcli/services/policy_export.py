"""Export a trained policy as one standalone file: ONNX or TorchScript.

The file maps a raw observation (as the env returns it) to the env's action, deterministically:
the frozen observation normalization, the network and the action clipping or rescaling are all in
it, so whoever runs it needs neither rlcli nor the training config. A recurrent policy takes its carry
as a second input and returns the next one (zeros at an episode's first step). A metadata JSON next
to the file says the names, shapes and dtypes.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rlcli.contracts import Algorithm, RecurrentState
from rlcli.registry import ConfigError

FORMATS = {"onnx": ".onnx", "torchscript": ".pt"}


class StandalonePolicy(nn.Module):
    """observation [, carry] -> env action [, next carry]: what rl-eval's deterministic episodes do per step."""

    def __init__(self, algo: Algorithm, obs_dtype: torch.dtype, carry_size: int) -> None:
        super().__init__()
        self.networks = algo.networks  # a submodule, so that its weights and statistics belong to this module
        self.algo, self.obs_dtype, self.carry_size = algo, obs_dtype, carry_size

    def forward(self, obs: torch.Tensor, carry: torch.Tensor | None = None) -> Any:
        x = self.networks.normalizer(obs.to(self.obs_dtype))
        state = None
        if self.carry_size:
            assert carry is not None
            state = RecurrentState(carry, torch.zeros_like(carry[:, 0]))  # the carry itself says where it stands
        out = self.algo.act(x, deterministic=True, state=state)
        action = self.algo.env_actions(out.actions)
        return action if not self.carry_size else (action, out.carry)


def numpy_policy(policy: StandalonePolicy) -> Any:
    """The same policy called the way an exported file is: numpy in, numpy out."""

    def act(obs: np.ndarray, carry: np.ndarray | None = None) -> Any:
        with torch.no_grad():
            args = [torch.as_tensor(obs)] + ([] if carry is None else [torch.as_tensor(carry)])
            out = policy(*args)
        return tuple(o.numpy() for o in out) if isinstance(out, tuple) else out.numpy()

    return act


def export(policy: StandalonePolicy, fmt: str, path: Path, example_obs: np.ndarray) -> None:
    """Write `policy` to `path` in `fmt`, with a batch dimension of any size."""
    if fmt not in FORMATS:
        raise ConfigError(f"export={fmt!r} is not a format; choose from: {', '.join(FORMATS)}")
    policy = policy.eval().cpu()
    obs = torch.as_tensor(example_obs[:2])
    args: tuple[torch.Tensor, ...] = (obs,)
    if policy.carry_size:
        args = (obs, torch.zeros(obs.shape[0], policy.carry_size))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with _quiet_exporters():
        if fmt == "onnx":
            require("onnx", "onnxscript")
            names = ["obs", "carry"][: len(args)]
            batch = torch.export.Dim("batch")
            torch.onnx.export(policy, args, str(tmp), dynamo=True, verbose=False, input_names=names,
                              output_names=["action", "next_carry"][: len(args)],
                              dynamic_shapes=tuple({0: batch} for _ in args), external_data=False)
        else:
            torch.jit.trace(policy, args, check_trace=False).save(str(tmp))
    tmp.replace(path)  # a failed export leaves no half-written file


def run_exported(path: Path, fmt: str) -> Any:
    """Load an exported file the way a user would (onnxruntime / torch.jit) and return a numpy callable."""
    if fmt == "onnx":
        require("onnxruntime")
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        inputs = [i.name for i in session.get_inputs()]

        def act_onnx(obs: np.ndarray, carry: np.ndarray | None = None) -> Any:
            feed = {inputs[0]: obs} | ({} if carry is None else {inputs[1]: carry})
            out = session.run(None, feed)
            return out[0] if len(out) == 1 else tuple(out)

        return act_onnx
    module = torch.jit.load(str(path))

    def act_script(obs: np.ndarray, carry: np.ndarray | None = None) -> Any:
        with torch.no_grad():
            out = module(torch.as_tensor(obs), *([] if carry is None else [torch.as_tensor(carry)]))
        return tuple(o.numpy() for o in out) if isinstance(out, tuple) else out.numpy()

    return act_script


def max_difference(reference: Any, exported: Any, observations: np.ndarray, carry_size: int) -> float:
    """Largest |difference| of actions (and carries) between two numpy policies over `observations`
    [steps, envs, ...], fed a step at a time; a recurrent policy's carry runs on from zeros (each policy
    gets the reference's carry, so a difference cannot grow through time unseen)."""
    worst = 0.0
    carry = np.zeros((observations.shape[1], carry_size), dtype=np.float32) if carry_size else None
    for obs in observations:
        ours, theirs = reference(obs, carry), exported(obs, carry)
        if carry_size:
            (ours, next_carry), (theirs, their_carry) = ours, theirs
            worst = max(worst, float(np.abs(next_carry - their_carry).max()))
            carry = next_carry
        worst = max(worst, float(np.abs(np.asarray(ours, dtype=np.float64) - np.asarray(theirs, np.float64)).max()))
    return worst


def input_dtype(policy: StandalonePolicy) -> np.dtype:
    """The observation dtype the file takes: uint8 for pixels, float32 otherwise."""
    return np.dtype(str(policy.obs_dtype).split(".")[1])


def metadata(policy: StandalonePolicy, fmt: str, env_id: str, obs_space: Any, act_space: Any,
             checkpoint: Path, env_config: dict[str, Any]) -> dict[str, Any]:
    """What a user of the file needs to call it."""
    inputs = [{"name": "obs", "shape": ["batch", *obs_space.shape], "dtype": str(input_dtype(policy))}]
    whole = np.issubdtype(np.dtype(act_space.dtype), np.integer)  # Discrete, MultiDiscrete (a joint team's)
    outputs = [{"name": "action", "shape": ["batch", *act_space.shape], "dtype": "int64" if whole else "float32"}]
    if policy.carry_size:
        inputs.append({"name": "carry", "shape": ["batch", policy.carry_size], "dtype": "float32",
                       "note": "zeros at an episode's first step, then the previous step's next_carry"})
        outputs.append({"name": "next_carry", "shape": ["batch", policy.carry_size], "dtype": "float32"})
    return {"format": fmt, "env": env_id, "checkpoint": str(checkpoint), "deterministic": True,
            "inputs": inputs, "outputs": outputs, "observation_space": str(obs_space),
            "action_space": str(act_space),
            # how training's env was made: its wrappers (observation_indices, atari, frame_stack) shape the input
            "env_config": env_config}


def write_metadata(path: Path, data: dict[str, Any]) -> None:
    path.with_suffix(".json").write_text(json.dumps(data, indent=1))


def require(*modules: str) -> None:
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"export needs {', '.join(missing)}: pip install -e '.[export]'")


@contextlib.contextmanager
def _quiet_exporters() -> Iterator[None]:
    """torch's exporters print progress and deprecation notes meant for their developers, not for rl-eval's user."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript")]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for log, level in zip(loggers, levels, strict=True):
            log.setLevel(level)
