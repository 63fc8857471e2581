"""Multi-agent envs that `rlcli.train(env=<function>)` was given in this process: env=pz reads an env.id of the form
module:function, so each such function is reachable as `rlcli.envs.python_made:<its name>` for as long as the
process lives (as a gymnasium function's `rlcli-python/<name>-v0` id is; a new process needs the function again:
`rlcli.load(run_dir, env=make_env)`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

MAKERS: dict[str, Callable[..., Any]] = {}


def __getattr__(name: str) -> Callable[..., Any]:
    try:
        return MAKERS[name]
    except KeyError:
        raise AttributeError(name) from None
