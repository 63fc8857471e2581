"""Run state as tensors and plain values, so that reading a checkpoint can never run code.

A checkpoint is read with `torch.load(weights_only=True)`: tensors, numbers, strings, bytes, lists,
tuples and dicts only; a pickle that names any other class or function is refused by torch itself.
Everything else a run holds is turned into those types here, each as a small tagged dict:

- numpy arrays and scalars: their raw bytes, dtype string and shape (object arrays are refused);
- `collections.deque`: its items and maxlen;
- numpy `Generator` / `RandomState`: the bit generator's state (a name from a fixed list, and ints);
- MuJoCo's `MjData`: `mj_getState`'s integration state (restored with `mj_setState`);
- enums and plain Python objects (an env's `RunningMeanStd`, say): their attributes, by class name.

Encoding is idempotent: a record is already plain, so the env state that envs/state.py encodes
passes through the checkpoint's encoding unchanged.

`decode` rebuilds values of the first kinds from the file alone. Objects and enums are never built
from a name in the file: `restore_into` writes their attributes into the objects that the config
already built (an env wrapper's statistics), after checking that the class names match.
"""

from __future__ import annotations

import collections
import copy
import enum
from typing import Any

import numpy as np
import torch

TAG = "__rlcli_type__"
_BIT_GENERATORS = {"PCG64": np.random.PCG64, "PCG64DXSM": np.random.PCG64DXSM, "MT19937": np.random.MT19937,
                   "Philox": np.random.Philox, "SFC64": np.random.SFC64}
_PLAIN = (type(None), bool, int, float, str, bytes, torch.Tensor)


class Unsupported(TypeError):
    """A value that has no plain form (an open file, a function, a C++ handle)."""


def _qualname(obj: Any) -> str:
    kind = type(obj)
    return f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', kind.__name__)}"


def encode(value: Any, objects: bool = False) -> Any:
    """`value` as tensors and plain Python values; `objects` allows enums and objects by their attributes."""
    if isinstance(value, np.generic):  # before the plain types: np.float64 is a float
        return {TAG: "npscalar", "dtype": value.dtype.str, "data": value.tobytes()}
    if isinstance(value, torch.Tensor) and value.untyped_storage().nbytes() > value.nbytes:
        return value.clone()  # a view (a population member's row of stacked weights): saved alone, not its storage
    if isinstance(value, bytes) and not value:
        return {TAG: "bytes", "data": _raw(value)}
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise Unsupported("a numpy array of Python objects")
        array = np.ascontiguousarray(value)
        return {TAG: "ndarray", "dtype": array.dtype.str, "shape": list(array.shape), "data": _raw(array.tobytes())}
    if isinstance(value, (list, tuple)):
        items = [encode(v, objects) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, collections.deque):
        return {TAG: "deque", "items": [encode(v, objects) for v in value], "maxlen": value.maxlen}
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, (str, int, float, bool, type(None))):
                raise Unsupported(f"a dict key of type {type(key).__name__}")
        return {key: encode(v, objects) for key, v in value.items()}
    if isinstance(value, np.random.Generator):
        return {TAG: "np_generator", "state": encode(value.bit_generator.state)}
    if isinstance(value, np.random.RandomState):
        return {TAG: "np_randomstate", "state": encode(value.get_state(legacy=False))}
    if type(value).__name__ == "MjData" and type(value).__module__.startswith("mujoco"):
        return {TAG: "mujoco_data", "state": encode(_mujoco_state(value))}
    if objects and isinstance(value, enum.Enum):
        return {TAG: "enum", "class": _qualname(value), "value": encode(value.value)}
    if objects and hasattr(value, "__dict__") and not callable(value) and not isinstance(value, type):
        attrs = {k: encode(v, objects) for k, v in vars(value).items()}
        return {TAG: "object", "class": _qualname(value), "attrs": attrs}
    raise Unsupported(f"a value of type {_qualname(value)}")


def decode(value: Any) -> Any:
    """The values `encode` made, rebuilt; enum and object records stay records (see `restore_into`)."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if isinstance(value, tuple):
        return tuple(decode(v) for v in value)
    if not isinstance(value, dict):
        return value
    kind = value.get(TAG)
    if kind is None:
        return {key: decode(v) for key, v in value.items()}
    if kind == "ndarray":
        dtype = _dtype(value["dtype"])
        data = _unraw(value["data"])
        return np.frombuffer(bytearray(data), dtype=dtype).reshape([int(n) for n in value["shape"]])
    if kind == "bytes":
        return _unraw(value["data"])
    if kind == "npscalar":
        return np.frombuffer(bytearray(value["data"]), dtype=_dtype(value["dtype"]))[0]
    if kind == "deque":
        return collections.deque([decode(v) for v in value["items"]], maxlen=value["maxlen"])
    if kind == "np_generator":
        state = decode(value["state"])
        generator = np.random.Generator(_bit_generator(state))
        generator.bit_generator.state = state
        return generator
    if kind == "np_randomstate":
        random_state = np.random.RandomState()
        random_state.set_state(decode(value["state"]))
        return random_state
    if kind in ("enum", "object", "mujoco_data"):
        return {**value, "attrs": decode(value["attrs"])} if kind == "object" else value
    raise ValueError(f"unknown record type {kind!r}")


def restore_into(current: Any, value: Any) -> Any:
    """What an attribute whose value is `current` becomes: an object or enum record is written into `current`
    (whose class must be the one recorded); anything else replaces it."""
    kind = value.get(TAG) if isinstance(value, dict) else None
    if kind == "object":
        if current is None or _qualname(current) != value["class"]:
            raise ValueError(f"expected a {value['class']}, the env has {_qualname(current)}")
        for key, attr in value["attrs"].items():
            setattr(current, key, restore_into(getattr(current, key, None), attr))
        return current
    if kind == "enum":
        if not isinstance(current, enum.Enum) or _qualname(current) != value["class"]:
            raise ValueError(f"expected a {value['class']}, the env has {_qualname(current)}")
        return type(current)(decode(value["value"]))
    if kind == "mujoco_data":
        if current is None or type(current).__name__ != "MjData":
            raise ValueError(f"expected MuJoCo data, the env has {_qualname(current)}")
        _set_mujoco_state(current, decode(value["state"]))
        return current
    if (isinstance(value, (list, tuple)) and isinstance(current, (list, tuple)) and len(value) == len(current)
            and any(isinstance(v, dict) and TAG in v for v in value)):  # a list of objects (env=pz: mpe2's entities)
        return type(current)(restore_into(c, v) for c, v in zip(current, value, strict=True))
    return copy.deepcopy(value)


def _raw(data: bytes) -> bytes | torch.Tensor:
    """Bytes as the checkpoint holds them: empty bytes as an empty uint8 tensor, since pickle writes `b""` as a call
    to `bytes()`, which `torch.load(weights_only=True)` refuses (an empty array, e.g. a robot's empty message in
    env=rware, made a checkpoint that saved but could not be read back)."""
    return data if data else torch.empty(0, dtype=torch.uint8)


def _unraw(data: bytes | torch.Tensor) -> bytes:
    return bytes(data.numpy().tobytes()) if isinstance(data, torch.Tensor) else data


def _dtype(text: str) -> np.dtype:
    dtype = np.dtype(text)
    if dtype.hasobject:
        raise ValueError("a numpy array of Python objects")
    return dtype


def _bit_generator(state: dict[str, Any]) -> Any:
    name = state.get("bit_generator")
    if name not in _BIT_GENERATORS:
        raise ValueError(f"unknown bit generator {name!r}; known: {', '.join(_BIT_GENERATORS)}")
    return _BIT_GENERATORS[name]()


def _mujoco_state(data: Any) -> np.ndarray:
    import mujoco

    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    state = np.empty(mujoco.mj_stateSize(data.model, spec))
    mujoco.mj_getState(data.model, data, state, spec)
    return state


def _set_mujoco_state(data: Any, state: np.ndarray) -> None:
    import mujoco

    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    if state.shape != (mujoco.mj_stateSize(data.model, spec),):
        raise ValueError("the MuJoCo model changed since the checkpoint")
    mujoco.mj_setState(data.model, data, np.ascontiguousarray(state, dtype=np.float64), spec)
    mujoco.mj_forward(data.model, data)
