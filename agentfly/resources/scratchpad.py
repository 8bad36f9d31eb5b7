"""``Scratchpad``: an in-process key-value store a rollout can write notes to.

The cheapest real resource there is: no process, no I/O. It is useful on its own (a "memory" tool whose
notes must not leak into the next rollout) and it is what the chaos test pools by the thousand, because
its counters make leaks visible: every instance knows how often it was started, reset and closed.
"""

from __future__ import annotations

import itertools
from typing import Any

_serial = itertools.count(1)


class Scratchpad:
    """A dict per rollout. ``reset`` empties it; ``close`` makes every later use fail loudly."""

    kind = "other"

    def __init__(self, spec: Any = None) -> None:
        options = getattr(spec, "options", None) or {}
        self.max_items = int(options.get("max_items", 1000))
        self.serial = next(_serial)
        self.notes: dict[str, str] = {}
        self.started = False
        self.closed = False
        self.resets = 0
        self.broken = False  # set by whoever finds it corrupted; health() reports it

    async def start(self) -> None:
        self.started = True

    def _check(self) -> None:
        if self.closed:
            raise RuntimeError(f"scratchpad {self.serial} was used after close")
        if not self.started:
            raise RuntimeError(f"scratchpad {self.serial} was used before start")

    def write(self, key: str, value: str) -> None:
        self._check()
        if key not in self.notes and len(self.notes) >= self.max_items:
            raise ValueError(f"scratchpad is full ({self.max_items} notes); overwrite or clear a key")
        self.notes[key] = value

    def mark_broken(self) -> None:
        """Found corrupted: its next reset fails and its health check says so (a method, so that a pad in
        another process, on the ``ray`` backend, is broken the same way)."""
        self.broken = True

    def read(self, key: str) -> str | None:
        self._check()
        return self.notes.get(key)

    async def reset(self) -> None:
        self._check()
        if self.broken:
            raise RuntimeError(f"scratchpad {self.serial} is broken")
        self.notes.clear()
        self.resets += 1

    async def health(self) -> bool:
        return self.started and not self.closed and not self.broken

    async def close(self) -> None:
        self.closed = True
        self.notes.clear()

    def kill(self) -> None:
        self.closed = True
