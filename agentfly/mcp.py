"""``af.mcp``: the tools of an MCP server, as AgentFly tools backed by a pooled session.

    import agentfly as af

    KV = af.mcp.server("kv", command=[sys.executable, "agentfly/resources/mcp_servers/kv_store.py"], reset_tool="reset")
    tools = af.mcp.tools_from(KV)            # one Tool per server tool: its name, description, input schema
    agent = af.Agent(model, tools=tools, reward=..., resources=af.ResourceEngine([KV]))

``tools_from`` opens one session to read the listing and closes it; during training each rollout's first call
acquires a session from the pool (``scope="rollout"``: its own, kept across its turns, reset before the next
rollout). Nothing here is declared by hand: names, descriptions and schemas are the server's.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from agentfly.resources.mcp import MCPArgumentError, MCPSession, MCPToolError, check_arguments, mcp_server
from agentfly.resources.spec import InfrastructureFailure, ResourceSpec
from agentfly.tools.schema import ArgumentError
from agentfly.tools.tool import Tool

server = mcp_server
MAX_DESCRIPTION = 2000  # characters of a server's tool description that go into every prompt


@dataclass
class MCPTool(Tool):
    """A tool of an MCP server. Arguments are checked against the server's input schema, not a signature."""

    server_tool: str = ""

    def validate(self, arguments: Any) -> dict[str, Any]:
        try:
            check_arguments(self.name, self.parameters, arguments)
        except MCPArgumentError as exc:
            raise ArgumentError(str(exc)) from None
        return {"arguments": arguments}


def _seeder(spec: ResourceSpec, listing: list[Any]) -> tuple[str, list[str]] | None:
    """The spec's ``seed_tool`` and the sample fields it takes (its input schema's properties), or None."""
    seed = spec.options.get("seed_tool")
    if not seed:
        return None
    entry = next((e for e in listing if e.name == seed), None)
    if entry is None:
        raise ValueError(f"MCP server {spec.name!r} has no tool {seed!r} (its seed_tool); it lists "
                         f"{sorted(e.name for e in listing)}")
    return str(seed), list((entry.input_schema or {}).get("properties") or {})


def _make_tool(spec: ResourceSpec, entry: Any, seeder: tuple[str, list[str]] | None = None) -> MCPTool:
    resource, name = spec.name, str(entry.name)

    async def call(arguments: dict[str, Any], context: Any) -> str:
        session: MCPSession = await context.resource(resource)
        try:
            if seeder is not None:  # the rollout's first call: its task data
                await session.seed_once(context.info, context.sample, *seeder)
            return await session.call(name, arguments)
        except InfrastructureFailure:
            # The session is gone: the pool destroys it instead of resetting it for the next rollout.
            mark = getattr(context, "mark_unhealthy", None)
            if callable(mark):
                mark(resource)
            raise

    description = str(entry.description or entry.title or name)[:MAX_DESCRIPTION]
    schema = dict(entry.input_schema or {"type": "object", "properties": {}})
    # The server's timeout is the session's call_timeout (a timeout there is the server's failure, not the
    # model's), so the tool itself has none.
    return MCPTool(fn=call, name=name, description=description, parameters=schema, timeout=None,
                   resource=resource, takes_context=True, server_tool=name)


async def atools_from(spec: ResourceSpec, *, include: Iterable[str] | None = None,
                      exclude: Iterable[str] = ()) -> list[MCPTool]:
    """``tools_from`` for code already inside an event loop."""
    if spec.factory is not MCPSession:
        raise TypeError(f"tools_from({spec.name!r}): not an MCP server spec; make one with af.mcp.server(...)")
    session = MCPSession(spec)
    await session.start()
    try:
        listing = list(session.tools)
    finally:
        await session.close()
    seeder = _seeder(spec, listing)
    hidden = {*exclude, *(spec.options[k] for k in ("reset_tool", "seed_tool") if spec.options.get(k))}
    wanted = set(include) if include is not None else None
    tools = []
    for entry in listing:
        if entry.name in hidden or (wanted is not None and entry.name not in wanted):
            continue
        if not re.fullmatch(r"[A-Za-z_][\w.-]{0,63}", entry.name):
            raise ValueError(f"MCP server {spec.name!r} lists a tool named {entry.name[:80]!r}; tool names must be "
                             "letters, digits, '_', '-', '.' (at most 64); exclude it with exclude=[...]")
        tools.append(_make_tool(spec, entry, seeder))
    if wanted is not None and (missing := wanted - {t.name for t in tools}):
        raise ValueError(f"MCP server {spec.name!r} has no tool {sorted(missing)}; it lists "
                         f"{sorted(e.name for e in listing)}")
    return tools


def tools_from(spec: ResourceSpec, *, include: Iterable[str] | None = None,
               exclude: Iterable[str] = ()) -> list[MCPTool]:
    """The server's tools as AgentFly ``Tool`` objects (starts the server once to list them).

    Args:
        spec: from ``af.mcp.server(...)``; add the same spec to the agent's ``ResourceEngine``.
        include: only these tools (default: all).
        exclude: leave these out (the spec's ``reset_tool`` and ``seed_tool`` are always left out).
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(atools_from(spec, include=include, exclude=exclude))
    # Called from inside a running loop (a notebook): list on a loop of its own in a thread.
    out: list[list[MCPTool]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(asyncio.run(atools_from(spec, include=include, exclude=exclude)))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, name="mcp-tools-from")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return out[0]


__all__ = ["MCPSession", "MCPTool", "MCPToolError", "atools_from", "server", "tools_from"]
