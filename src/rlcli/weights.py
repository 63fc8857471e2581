"""Network weights from another run's checkpoint: warm start (`actor.init_from`) and fixed priors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlcli import checkpoint
from rlcli.registry import ConfigError


def network_weights(data: dict[str, Any]) -> dict[str, Any]:
    """The networks' state dict inside a loaded checkpoint (format 1 named it `actor`)."""
    algo = data["algo"]
    return algo["networks"] if "networks" in algo else algo["actor"]


def load_network_weights(networks: Any, path: Path, key: str = "actor.init_from") -> None:
    """Copy the networks and their observation statistics from the checkpoint that `path` names (a file,
    `checkpoints/latest`, a run's `checkpoints/` or the run dir); one line naming `key` when they do not fit."""
    path = checkpoint.resolve(path)
    try:
        networks.load_state_dict(network_weights(checkpoint.load(path)))
    except RuntimeError as error:
        first = str(error).strip().splitlines()
        detail = first[1].strip() if len(first) > 1 else first[0]
        raise ConfigError(f"{key}={str(path)!r} does not fit this actor: {detail}") from None
