"""``lookup``: follow a chain of keys in the rollout's key-value store, one key per call.

The store (``KeyChainStore``) is a ``scope="rollout"`` resource: the first ``lookup`` of a rollout acquires
one from the pool and seeds it with the task sample's chain (``start``, ``links``, ``answer``: see
``agentfly.tasks.key_chain``); every later turn of that rollout reuses it, and releasing it at the end of the
rollout resets it for the next. The store keeps the walk's state across turns: where the walk stands (only
the key it has reached can be looked up, so the chain must be followed in order, each call's argument taken
from the previous observation) and how many lookups were made. The reward (``chain_answer``) reads that state:
an answer counts only when the walk reached the final value.

``lookup_rewarded`` is the same tool (the model sees the same name and schema) that also credits each turn
whose call follows a new link with ``HOP_REWARD`` (``context.reward_turn``): the per-hop turn reward that the
turn-level estimators (``algorithm.credit``) use on long chains.

``KEY_CHAIN`` is the pool this tool uses (the trainer and the web app take it from here)::

    agent = af.Agent(model, tools=[lookup], resources=af.ResourceEngine([KEY_CHAIN]))
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from agentfly.resources.builtin import register_builtin
from agentfly.resources.spec import Pool, ResourceSpec
from agentfly.tools.tool import tool

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


# Short docstring on purpose: it is in every prompt (the tool's schema), and the tiny model's tokenizer spells
# words it was not trained on letter by letter. No timeout: a dict lookup cannot hang, and on a loaded machine
# a busy event loop (hundreds of rollouts replayed at once) can resume it seconds late.
@tool(resource=RESOURCE, timeout=None)
async def lookup(key: str, context: Any) -> str:
    """Look up a key: returns the next key or the final value.

    Args:
        key: A key, e.g. k42.
    """
    store = await _seeded_store(context)
    return store.lookup(key)


async def _seeded_store(context: Any) -> KeyChainStore:
    store: KeyChainStore = await context.resource(RESOURCE)
    if not store.seeded:  # the rollout's first lookup: load its task sample's chain
        sample = context.sample
        store.seed(str(sample.get("id", context.rollout_id)), sample["start"], sample["links"], sample["answer"])
    return store


HOP_REWARD = 0.1  # per link followed; a 10-hop chain's hops add up to the outcome's 1.0


@tool(name="lookup", resource=RESOURCE, timeout=None)
async def lookup_rewarded(key: str, context: Any) -> str:
    """Look up a key: returns the next key or the final value.

    Args:
        key: A key, e.g. k42.
    """
    store = await _seeded_store(context)
    before = (store.position, store.done)
    reply = store.lookup(key)  # a wrong key raises: an observation, and no reward
    if (store.position, store.done) != before:  # a new link followed (each one credited once)
        context.reward_turn(HOP_REWARD, f"followed {key}")
    return reply
