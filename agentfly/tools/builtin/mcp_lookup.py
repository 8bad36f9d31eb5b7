"""``lookup`` with its store served by an MCP server: the key-chain task against ``mcp_servers/kv_store.py``.

The same tool, schema and reward as ``agentfly.tools.builtin.lookup`` and ``chain_answer`` (so a model warm-started
on the in-process store reads the same prompt), with the store replaced by a stdio MCP server in the sandbox,
one session per rollout (``scope="rollout"``): the first lookup of a rollout seeds that session with the task
sample's chain, later turns walk it, and the pool calls the server's ``reset`` tool before the next rollout
gets the session. The reward asks the server's ``status`` tool whether this rollout's walk reached the end.

    rollout:
      tools: ["agentfly.tools.builtin.mcp_lookup:lookup"]
      reward: "agentfly.tools.builtin.mcp_lookup:chain_answer"
    resources:
      kv_mcp: {spec: "agentfly.tools.builtin.mcp_lookup:KEY_CHAIN_MCP"}
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from agentfly.resources.mcp import MCPSession, mcp_server
from agentfly.resources.spec import Pool
from agentfly.rewards.builtin.math import answers_equal, extract_answer
from agentfly.rewards.reward import reward
from agentfly.tools.tool import tool

RESOURCE = "kv_mcp"
STORE = Path(__file__).resolve().parents[2] / "resources" / "mcp_servers" / "kv_store.py"

# One server process per concurrent rollout (16 prompts x 8 samples = 128 in the key-chain config); reset
# with the server's own tool, so a process is started once and reused across steps. Four start at a time: 128
# started at once on 2 cores each missed its 60 s start timeout (each imports the MCP SDK, about 1 s of CPU).
KEY_CHAIN_MCP = mcp_server(RESOURCE, command=[sys.executable, str(STORE)], reset_tool="reset",
                           pool=Pool(min=0, max=128, starting=4), acquire_timeout=300, call_timeout=30,
                           health_interval=0)


async def _session(context: Any) -> MCPSession:
    session: MCPSession = await context.resource(RESOURCE)
    # The rollout's first lookup loads its sample's chain (a key-chain sample's fields are the seed tool's).
    await session.seed_once(context.info, context.sample, "seed", ("start", "links", "answer"))
    return session


# The docstring is the in-process tool's, word for word: it is in every prompt.
@tool(resource=RESOURCE, timeout=None)
async def lookup(key: str, context: Any) -> str:
    """Look up a key: returns the next key or the final value.

    Args:
        key: A key, e.g. k42.
    """
    session = await _session(context)
    return await session.call("lookup", {"key": key})


@reward
async def chain_answer(final_answer: str | None, answer: str, context: Any) -> dict[str, float]:
    """1.0 for the chain's final value after a walk that reached it, else 0.0; with the store's lookup count."""
    if context is None or not context.holds(RESOURCE):  # never looked anything up
        return {"reward": 0.0, "lookups": 0.0, "reached_final": 0.0}
    session: MCPSession = await context.resource(RESOURCE)
    status = json.loads(await session.call("status", {}))
    right = bool(status["done"]) and answers_equal(extract_answer(final_answer), answer)
    return {"reward": float(right), "lookups": float(status["lookups"]), "reached_final": float(status["done"])}
