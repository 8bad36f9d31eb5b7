"""``KeyChainStore``: the key-chain task's store, a ``scope="rollout"`` resource (``KEY_CHAIN``, named ``kv``).

The ``lookup`` tool (``agentfly.tools.builtin.lookup``) walks it and the ``chain_answer`` reward
(``agentfly.rewards.builtin.chain``) reads where the walk ended; both reach it here, in the layer below them,
so that neither imports the other.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from agentfly.resources.builtin import register_builtin
from agentfly.resources.spec import Pool, ResourceSpec

RESOURCE = "kv"

_serial = itertools.count(1)


class KeyChainStore:
    """One rollout's key-value store: ``key -> next key`` links ending in a final value.

    ``lookup(key)`` answers ``"next: k7"`` or ``"final: 421"`` for the key the walk has reached, and an error
    for any other key (one not in the store, or one further down the chain that was not reached yet). State
    kept across the rollout's turns: ``position`` (links followed), ``lookups`` (every call, failed ones too),
    ``done`` (the final value was read). ``reset`` forgets all of it, the seed included.
    """

    kind = "other"

    def __init__(self, spec: Any = None) -> None:
        self.serial = next(_serial)
        self.started = False
        self.closed = False
        self.resets = 0
        self._clear()

    def _clear(self) -> None:
        self.seed_id: str | None = None
        self.chain: list[str] = []  # the keys in walking order
        self.final: str | None = None
        self.position = 0
        self.lookups = 0
        self.done = False

    @property
    def seeded(self) -> bool:
        return self.seed_id is not None

    def seed(self, sample_id: str, start: str, links: Mapping[str, str], final: str) -> None:
        """Load one task sample's chain: ``start`` -> ``links[start]`` -> ... -> the last key, whose value is
        ``final``. Raises ValueError on a chain that loops or breaks off."""
        self._check()
        chain, key = [start], start
        while key in links:
            key = links[key]
            if key in chain:
                raise ValueError(f"sample {sample_id!r}: the chain loops back to {key!r}")
            chain.append(key)
        if len(chain) != len(links) + 1:
            raise ValueError(f"sample {sample_id!r}: links {dict(links)} do not form one chain from {start!r}")
        self.seed_id, self.chain, self.final = sample_id, chain, str(final)
        self.position, self.lookups, self.done = 0, 0, False

    def lookup(self, key: str) -> str:
        """The next key or the final value behind ``key``; ValueError (shown to the model) for any other key."""
        self._check()
        if not self.seeded:
            raise RuntimeError(f"key-value store {self.serial} was used before seed()")
        self.lookups += 1
        key = key.strip()
        here = self.chain[min(self.position, len(self.chain) - 1)]
        if key != here:
            raise ValueError(f"key {key!r} cannot be looked up here; look up the key you were last given")
        if self.position == len(self.chain) - 1:
            self.done = True
            return f"final: {self.final}"
        self.position += 1
        return f"next: {self.chain[self.position]}"

    # What the tools call: async, so that a store in another process (an actor on the ``ray`` backend, whose
    # handle awaits every method) and one in this process are used the same way.
    async def load(self, sample_id: str, start: str, links: Mapping[str, str], final: str) -> None:
        """``seed``, awaited."""
        self.seed(sample_id, start, links, final)

    async def follow(self, key: str) -> tuple[str, bool]:
        """``lookup``, awaited, and whether it followed a link not followed before (the walk moved on)."""
        before = (self.position, self.done)
        reply = self.lookup(key)
        return reply, (self.position, self.done) != before

    def _check(self) -> None:
        if self.closed:
            raise RuntimeError(f"key-value store {self.serial} was used after close")
        if not self.started:
            raise RuntimeError(f"key-value store {self.serial} was used before start")

    async def start(self) -> None:
        self.started = True

    async def reset(self) -> None:
        self._check()
        self._clear()
        self.resets += 1

    async def health(self) -> bool:
        return self.started and not self.closed

    async def close(self) -> None:
        self.closed = True
        self._clear()

    def kill(self) -> None:
        self.closed = True


# In-process and cheap: one store per concurrent rollout (a training step of 16 x 8 rollouts holds 128).
KEY_CHAIN = register_builtin(ResourceSpec(
    name=RESOURCE, factory=KeyChainStore, kind="other", backend="inprocess", pool=Pool(min=0, max=512),
    scope="rollout", acquire_timeout=60, health_interval=0))
