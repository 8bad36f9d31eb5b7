"""``lookup``: follow a chain of keys in the rollout's key-value store, one key per call.

The store (``KeyChainStore``, in ``agentfly.resources.key_chain``) is a ``scope="rollout"`` resource: the first ``lookup`` of a rollout acquires
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

from typing import Any

from agentfly.resources.key_chain import KEY_CHAIN, RESOURCE, KeyChainStore
from agentfly.tools.tool import tool

__all__ = ["HOP_REWARD", "KEY_CHAIN", "RESOURCE", "KeyChainStore", "lookup", "lookup_rewarded"]

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
    reply, _ = await store.follow(key)
    return reply


async def _seeded_store(context: Any) -> KeyChainStore:
    store: KeyChainStore = await context.resource(RESOURCE)
    if not store.seeded:  # the rollout's first lookup: load its task sample's chain
        sample = context.sample
        await store.load(str(sample.get("id", context.rollout_id)), sample["start"], sample["links"], sample["answer"])
    return store


HOP_REWARD = 0.1  # per link followed; a 10-hop chain's hops add up to the outcome's 1.0


@tool(name="lookup", resource=RESOURCE, timeout=None)
async def lookup_rewarded(key: str, context: Any) -> str:
    """Look up a key: returns the next key or the final value.

    Args:
        key: A key, e.g. k42.
    """
    store = await _seeded_store(context)
    reply, moved = await store.follow(key)  # a wrong key raises: an observation, and no reward
    if moved:  # a new link followed (each one credited once)
        context.reward_turn(HOP_REWARD, f"followed {key}")
    return reply
