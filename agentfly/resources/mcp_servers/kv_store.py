"""A stateful MCP server: a key-value store per client session, written with the official ``mcp`` SDK.

Each connected session has its own store: over stdio that is the whole process (one client per process);
over streamable HTTP every ``Mcp-Session-Id`` gets its own, so two rollouts that talk to one HTTP server
never see each other's keys, and a new session starts empty. Besides ``put``/``get``/``keys`` it serves the
key-chain task (``seed``, ``lookup``, ``status``: the walk described in ``agentfly.tools.builtin.lookup``), so
``examples/key_chain`` can train against it, and ``reset``, which a pool calls between rollouts instead of
restarting the process (``reset_tool="reset"`` in ``agentfly.mcp.server``).

Run it on its own (it imports nothing but the SDK, so it runs inside a sandbox that cannot read AgentFly):

    python agentfly/resources/mcp_servers/kv_store.py                                   # stdio
    python agentfly/resources/mcp_servers/kv_store.py --http --port 8765                # streamable HTTP on 127.0.0.1
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

MAX_KEYS = 1000
MAX_VALUE = 10_000


@dataclass
class Store:
    """One session's keys and, when seeded, its key-chain walk."""

    items: dict[str, str] = field(default_factory=dict)
    chain: list[str] = field(default_factory=list)
    final: str | None = None
    position: int = 0
    lookups: int = 0
    done: bool = False


MAX_SESSIONS = 1000
# By session: over HTTP the Mcp-Session-Id header names it; stdio has none, since the process serves one client.
# Insertion-ordered, so past MAX_SESSIONS the oldest session's store is dropped.
stores: dict[str, Store] = {}
server: MCPServer = MCPServer("agentfly-kv", instructions="A key-value store; each session has its own.")


def _session(ctx: Context[Any, Any]) -> str:
    headers = ctx.headers or {}
    return str(headers.get("mcp-session-id") or "stdio")


def _store(ctx: Context[Any, Any]) -> Store:
    session = _session(ctx)
    if session not in stores and len(stores) >= MAX_SESSIONS:
        stores.pop(next(iter(stores)))
    return stores.setdefault(session, Store())


@server.tool()
def put(key: str, value: str, ctx: Context[Any, Any]) -> str:
    """Store a value under a key (this session only)."""
    store = _store(ctx)
    if len(value) > MAX_VALUE:
        raise ToolError(f"value is {len(value)} characters; at most {MAX_VALUE}")
    if key not in store.items and len(store.items) >= MAX_KEYS:
        raise ToolError(f"the store is full ({MAX_KEYS} keys); overwrite a key")
    store.items[key] = value
    return "ok"


@server.tool()
def get(key: str, ctx: Context[Any, Any]) -> str:
    """The value stored under a key in this session."""
    store = _store(ctx)
    if key not in store.items:
        raise ToolError(f"no key {key!r} in this session's store")
    return store.items[key]


@server.tool()
def keys(ctx: Context[Any, Any]) -> list[str]:
    """The keys stored in this session, sorted."""
    return sorted(_store(ctx).items)


@server.tool()
def seed(start: str, links: dict[str, str], answer: str, ctx: Context[Any, Any]) -> str:
    """Load a key chain: start -> links[start] -> ... -> the last key, whose value is answer (the names are a
    key-chain task sample's, so a job's ``seed_tool`` passes the sample's fields straight in)."""
    store = _store(ctx)
    chain, key = [start], start
    while key in links:
        key = links[key]
        if key in chain:
            raise ToolError(f"the chain loops back to {key!r}")
        chain.append(key)
    if len(chain) != len(links) + 1:
        raise ToolError("the links do not form one chain from start")
    store.chain, store.final, store.position, store.lookups, store.done = chain, answer, 0, 0, False
    return "ok"


@server.tool()
def lookup(key: str, ctx: Context[Any, Any]) -> str:
    """Look up a key: returns the next key or the final value."""
    store = _store(ctx)
    if not store.chain:
        raise ToolError("nothing seeded in this session; call seed first")
    store.lookups += 1
    here = store.chain[min(store.position, len(store.chain) - 1)]
    if key.strip() != here:
        raise ToolError(f"key {key.strip()!r} cannot be looked up here; look up the key you were last given")
    if store.position == len(store.chain) - 1:
        store.done = True
        return f"final: {store.final}"
    store.position += 1
    return f"next: {store.chain[store.position]}"


@server.tool()
def status(ctx: Context[Any, Any]) -> str:
    """The walk's state as JSON: seeded, position, lookups, done."""
    store = _store(ctx)
    return json.dumps({"seeded": bool(store.chain), "position": store.position, "lookups": store.lookups,
                       "done": store.done, "keys": len(store.items)})


@server.tool()
def reset(ctx: Context[Any, Any]) -> str:
    """Forget everything this session stored."""
    stores.pop(_session(ctx), None)
    return "ok"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--http", action="store_true", help="serve streamable HTTP instead of stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    if args.http:
        server.run("streamable-http", host=args.host, port=args.port)
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
