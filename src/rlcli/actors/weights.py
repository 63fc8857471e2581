"""Network weights from another run's checkpoint: warm start (`actor.init_from`) and fixed priors."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from rlcli.registry import ConfigError
from rlcli.services import checkpoint


def network_weights(data: dict[str, Any]) -> dict[str, Any]:
    """The networks' state dict inside a loaded checkpoint (format 1 named it `actor`)."""
    algo = data["algo"]
    weights = algo.get("networks", algo.get("actor")) if isinstance(algo, dict) else None
    if not isinstance(weights, dict):
        raise checkpoint.CheckpointError("the checkpoint holds no network weights (algo.networks)")
    return weights


_MEMBER = re.compile(r"(?:^|\.)(?:\w+\.)?members\.\d+\.")
_GROUP = re.compile(r"^groups\.[^.]+\.")  # a group's own algorithm's networks (algo.groups)


def copied_into_members(weights: dict[str, Any], target: dict[str, Any]) -> dict[str, Any]:
    """A shared network's weights copied into every per-agent or per-group copy (actors/per_agent.py:
    `members.<i>.` in the target's keys) and into every group's own algorithm (algos/grouped.py: `groups.<name>.`),
    so that a run with env.share_params=false, env.groups or algo.groups can start from a shared-parameter run;
    weights whose keys already fit are returned as they are. A source with copies of its own fills only the same
    layout (which copy was which group is not in its weights)."""
    if set(weights) == set(target) or not any("members." in key or key.startswith("groups.") for key in target):
        return weights
    shared_source = not any("members." in key or key.startswith("groups.") for key in weights)
    copied = {}
    for key in target:
        if key in weights:
            copied[key] = weights[key]
            continue
        if not shared_source:
            continue
        # groups.a.x -> x; nets.0.members.1.x -> nets.0.x; else q.agents.members.1.x -> q.x
        inner = _GROUP.sub("", key, count=1)
        candidates = [inner] + [re.sub(pattern, lambda m: "." if m.group(0).startswith(".") else "", inner, count=1)
                                for pattern in (r"members\.\d+\.", _MEMBER.pattern)]
        shared = next((c for c in candidates if c in weights), None)
        if shared is not None:
            copied[key] = weights[shared]
    return copied if len(copied) == len(target) else weights


def load_network_weights(networks: Any, path: Path, key: str = "actor.init_from", trusted: bool = False) -> None:
    """Copy the networks and their observation statistics from the checkpoint that `path` names (a file,
    `checkpoints/latest`, a run's `checkpoints/` or the run dir); one line naming `key` when they do not fit.
    `trusted` (trusted_checkpoint=true) also reads a format-1 checkpoint, a pickle that can run code."""
    path = checkpoint.resolve(path)
    data = checkpoint.load(path, trusted=trusted)
    checkpoint.require(data, path, "algo")
    weights = copied_into_members(network_weights(data), networks.state_dict())
    try:
        networks.load_state_dict(weights)
    except RuntimeError:
        raise ConfigError(f"{key}={str(path)!r} does not fit this actor: "
                          f"{weights_mismatch(weights, networks.state_dict())}") from None


def weights_mismatch(saved: dict[str, Any], here: dict[str, Any]) -> str:
    """How a checkpoint's network weights differ from the networks built here, in a few words (torch's own message
    lists every key: a thousand characters for a group's networks)."""

    def some(names: list[str]) -> str:
        return ", ".join(names[:2]) + (f" and {len(names) - 2} more" if len(names) > 2 else "")

    def weights(n: int) -> str:
        return f"{n} weight{'s' if n != 1 else ''}"

    missing = sorted(set(here) - set(saved))
    extra = sorted(set(saved) - set(here))
    shapes = [f"{k}: {list(saved[k].shape)} there, {list(here[k].shape)} here" for k in sorted(set(saved) & set(here))
              if hasattr(saved[k], "shape") and hasattr(here[k], "shape") and saved[k].shape != here[k].shape]
    parts = ([f"{weights(len(missing))} it lacks ({some(missing)})"] if missing else []) + \
        ([f"{weights(len(extra))} these networks lack ({some(extra)})"] if extra else []) + \
        ([f"{len(shapes)} of another shape ({'; '.join(shapes[:2])}{' ...' if len(shapes) > 2 else ''})"]
         if shapes else [])
    return ("; ".join(parts) or "its weights do not load") + (
        ": its networks were built otherwise (another algorithm or actor, other env.groups / env.share_params, "
        "another number of agents or observation size)")
