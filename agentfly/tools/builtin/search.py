"""``search``: keyword search over the job's retrieval index (by default WIKI_MINI, resource "wiki")."""

from __future__ import annotations

from typing import Any

from agentfly.tools.tool import tool

RESOURCE = "wiki"


@tool(resource=RESOURCE, timeout=30)
async def search(query: str, context: Any, k: int = 3) -> str:
    """Search the encyclopedia and return the best-matching passages.

    Args:
        query: Keywords or a question, e.g. "Brelford founded".
        k: How many passages to return (1-10).
    """
    index = await context.resource(RESOURCE)
    hits = await index.search(query, max(1, min(int(k), 10)))
    if not hits:
        return f"No passage matches {query!r}; try other keywords."
    return "\n\n".join(f"[{n}] {h.title}\n{h.text}" for n, h in enumerate(hits, 1))
