"""A member's stream of numpy's global generator, kept in its own MT19937 object.

numpy's global functions (`np.random.rand`, `np.random.get_state`, ...) are methods of one RandomState. Swapping a
member's state in and out with `get_state` / `set_state` converts the 624-word key to and from Python objects,
~35 us each way: most of a member's turn (two turns per member per iteration). Instead, the RandomState is pointed
at the member's own bit generator for its turn (~1 us) and at a spare one between turns, so draws outside the turns
advance no member's stream (a copy of the global state as the first turn found it).

Re-pointing the RandomState clears the legacy gaussian it caches (Box-Muller makes normals in pairs). A member whose
state has no cached gaussian, the usual case, loses nothing; one that has (it drew an odd number of legacy normals)
gets its full state set back at each turn. Whether a turn drew at all is read from the generator's raw state (its
key and position, ~1 us), and only then is the full state read back.
"""

from __future__ import annotations

import ctypes
from typing import Any, cast

import numpy as np

_GLOBAL: Any = np.random.mtrand._rand
_RAW_BYTES = 624 * 4 + 4  # MT19937's state: uint32 key[624], int pos


def _raw(generator: np.random.MT19937) -> bytes:
    return ctypes.string_at(generator.ctypes.state_address, _RAW_BYTES)


class _BetweenTurns:
    """The generator numpy's global functions draw from between the members' turns: a copy of the global state as
    the first turn found it (deterministic, as the copies the turns used to leave behind were)."""

    generator: np.random.MT19937 | None = None

    @classmethod
    def get(cls) -> np.random.MT19937:
        if cls.generator is None:
            cls.generator = np.random.MT19937()
            cls.generator.state = _GLOBAL._bit_generator.state
        return cls.generator


class NumpyStream:
    """`enter()` makes the member's stream numpy's global one, `leave()` takes it back. `state`: the legacy state
    tuple (np.random.get_state's, as a checkpoint holds it) the stream starts from."""

    def __init__(self, state: tuple[Any, ...]) -> None:
        self.generator = np.random.MT19937()
        self._state = state
        self._reload = True  # the generator takes `state` at the first turn
        self._drawn_at_entry = b""

    def enter(self) -> None:
        _BetweenTurns.get()
        _GLOBAL.__init__(self.generator)  # (clears the cached gaussian: set back below where there is one)
        if self._reload or self._state[3]:
            np.random.set_state(self._state)
            self._reload = False
        self._drawn_at_entry = _raw(self.generator)

    def leave(self) -> None:
        if self._state[3] or _raw(self.generator) != self._drawn_at_entry:  # it drew (or seeded, or set a state)
            self._state = cast(tuple[Any, ...], np.random.get_state(legacy=True))
        _GLOBAL.__init__(_BetweenTurns.get())
