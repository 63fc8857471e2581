"""Library deprecation noise kept out of the console.

MuJoCo 3.x prints a warning for every model it compiles that still uses a deprecated attribute
(gymnasium's HalfCheetah-v5 says `settotalmass` eleven times a run). Such known messages go to
train.log once; any other MuJoCo warning is still shown, once per distinct text.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("rlcli")

KNOWN = ("is deprecated and will be removed in a future release",)
_seen: set[str] = set()
_pending: list[str] = []  # known messages not yet in train.log (the envs are built before its handler exists)
_installed = False


def _on_mujoco_warning(message: str) -> None:
    text = str(message).strip()
    if text in _seen:
        return
    _seen.add(text)
    if any(known in text for known in KNOWN):
        _pending.append(text)
    else:
        from rlcli.services.log import say

        say(f"rl-train: warning: mujoco: {text}")


def quiet_mujoco() -> None:
    """Route MuJoCo's C-level warnings through `_on_mujoco_warning` (when MuJoCo is installed)."""
    global _installed
    if _installed:
        return
    try:
        import mujoco
    except ImportError:
        return
    mujoco.set_mju_user_warning(_on_mujoco_warning)
    _installed = True


def log_pending() -> None:
    """Write the known library warnings seen so far to train.log, once each (the trainer calls this at start)."""
    while _pending:
        logger.info("mujoco (a library deprecation, kept off the console): %s", _pending.pop(0))
