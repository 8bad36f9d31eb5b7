"""``chain_answer``: the key-chain task's reward, read from the rollout's key-value store.

The answer counts only when the store itself says the walk reached the final value (``KeyChainStore.done``):
a number that happens to match without the lookups earns nothing. The reward runs before the rollout
releases its resources, so the store it reads is the one this rollout's lookups walked.
"""

from __future__ import annotations

from typing import Any

from agentfly.resources.key_chain import RESOURCE
from agentfly.rewards.builtin.math import answers_equal, extract_answer
from agentfly.rewards.reward import reward


@reward
async def chain_answer(final_answer: str | None, answer: str, context: Any) -> dict[str, float]:
    """1.0 for the chain's final value after a walk that reached it, else 0.0; with the store's lookup count."""
    if context is None or not context.holds(RESOURCE):  # never looked anything up
        return {"reward": 0.0, "lookups": 0.0, "reached_final": 0.0}
    store = await context.resource(RESOURCE)
    right = store.done and answers_equal(extract_answer(final_answer), answer)
    return {"reward": float(right), "lookups": float(store.lookups), "reached_final": float(store.done)}
