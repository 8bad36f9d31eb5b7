"""Worker-side: start or reach a team's MCP server, list its tools, try one. Never run in the web process.

A stdio server runs in the sandbox of the local backend (``agentfly.mcp``: no secrets in its environment,
rlimits, Landlock, no network unless allowed). The rule is checked again here, before anything starts. What the
server says (names, descriptions, schemas, results) is bounded in size before it is stored or returned; pages
and the API render it escaped.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from webapp.mcpservers.models import MCPServer, MCPServerVersion, Status
from webapp.mcpservers.rules import NotAllowed, allowed_launch
from webapp.registry.tryslots import release_slot

ONCE = {"acks_late": False, "reject_on_worker_lost": False}
MAX_TOOLS, MAX_DESCRIPTION, MAX_SCHEMA, MAX_OBSERVATION = 64, 2000, 16_000, 16_000
NAME = re.compile(r"[A-Za-z_][\w.-]{0,63}")


def server_spec(server: MCPServer, start_timeout: float | None = None) -> Any:
    """The ``af.mcp.server`` spec of a row, after the rule allows it again."""
    from agentfly.mcp import server as mcp_server

    timeout = float(settings.AGENTFLY_CHILD_TIMEOUT)
    start = start_timeout or max(timeout, 60.0)  # a Python server imports the SDK first: seconds on a busy worker
    return mcp_server(server.name, **allowed_launch(server), start_timeout=start, call_timeout=timeout)


def bounded_listing(tools: list[Any]) -> list[dict[str, Any]]:
    """The listing as stored: at most MAX_TOOLS tools, valid names, descriptions and schemas cut to size."""
    if len(tools) > MAX_TOOLS:
        raise NotAllowed(f"the server lists {len(tools)} tools; at most {MAX_TOOLS} are accepted")
    out = []
    for tool in tools:
        name = str(tool.name)
        if not NAME.fullmatch(name):
            raise NotAllowed(f"the server lists a tool named {name[:80]!r}; names must be letters, digits, "
                             "'_', '-', '.' (at most 64)")
        schema = dict(tool.input_schema or {})
        if len(json.dumps(schema)) > MAX_SCHEMA:
            raise NotAllowed(f"tool {name!r}'s input schema is larger than {MAX_SCHEMA} characters")
        out.append({"name": name, "description": str(tool.description or "")[:MAX_DESCRIPTION],
                    "input_schema": schema})
    return out


def check_named_tools(server: MCPServer, tools: list[dict[str, Any]]) -> None:
    """The reset and seed tools the server was registered with must be tools it lists."""
    listed = {t["name"] for t in tools}
    unlisted = [f"{kind} {name!r}" for kind, name in (("reset_tool", server.reset_tool), ("seed_tool", server.seed_tool))
                if name and name not in listed]
    if unlisted:
        raise NotAllowed(f"the server lists no {' and no '.join(unlisted)}; it lists {', '.join(sorted(listed))}: "
                         "register it again naming one of those, or none")


@shared_task(name="webapp.mcpservers.tasks.inspect_mcp_server", time_limit=120, **ONCE)
def inspect_mcp_server(server_id: int, slot: dict[str, Any] | None = None, timeout: float | None = None) -> str:
    """Start (or reach) the server, list its tools, store the listing as a version, or the reason it failed.
    The server has ``timeout`` seconds (``AGENTFLY_MCP_INSPECT_TIMEOUT``) to list its tools; the inspection's
    place in the pool (``slot``) is given back however it ends."""
    try:
        return _inspect(server_id, float(timeout or settings.AGENTFLY_MCP_INSPECT_TIMEOUT))
    finally:
        release_slot(slot)


def _inspect(server_id: int, timeout: float) -> str:
    from agentfly.resources.mcp import MCPSession

    server = MCPServer.objects.select_related("team").filter(pk=server_id).first()
    if server is None:
        return "gone"

    async def listing() -> list[Any]:
        session = MCPSession(server_spec(server, start_timeout=timeout))
        await session.start()
        try:
            return list(session.tools)
        finally:
            await session.close()

    started = time.monotonic()
    try:
        tools = bounded_listing(asyncio.run(listing()))
        check_named_tools(server, tools)
    except Exception as exc:  # NotAllowed, a server that did not start, the soft time limit: the user reads why
        error = str(exc)
        if time.monotonic() - started >= timeout:
            error = (f"the server did not list its tools within AGENTFLY_MCP_INSPECT_TIMEOUT={timeout:g} s "
                     f"(make it answer sooner, or ask the operator to raise it): {error}")
        MCPServer.objects.filter(pk=server_id).update(status=Status.FAILED, error=error[:2000],
                                                      inspected_at=timezone.now())
        return "failed"
    digest = hashlib.sha256(json.dumps(tools, sort_keys=True).encode()).hexdigest()
    with transaction.atomic():
        version, _ = MCPServerVersion.objects.get_or_create(server=server, listing_hash=digest,
                                                            defaults={"tools": tools})
        MCPServer.objects.filter(pk=server_id).update(status=Status.READY, error="", current_version=version,
                                                      inspected_at=timezone.now())
    return "ready"


@shared_task(name="webapp.mcpservers.tasks.try_mcp_tool", time_limit=120, **ONCE)
def try_mcp_tool(server_id: int, tool: str, arguments: Any) -> dict[str, Any]:
    """Call one tool of the server in a fresh session, as a rollout's first call would."""
    from agentfly.resources.mcp import MCPSession

    server = MCPServer.objects.select_related("team").filter(pk=server_id).first()
    if server is None:
        return {"observation": "", "error": "this MCP server no longer exists", "latency": 0.0}
    start = time.perf_counter()

    async def call() -> str:
        session = MCPSession(server_spec(server))
        await session.start()
        try:
            return await session.call(tool, arguments)
        finally:
            await session.close()

    try:
        observation, error = asyncio.run(call()), None
    except Exception as exc:  # an argument error, the tool's error, a dead server: shown as the model would see it
        observation, error = "", f"{type(exc).__name__}: {exc}"[:MAX_OBSERVATION]
    return {"observation": observation[:MAX_OBSERVATION], "error": error, "latency": time.perf_counter() - start}
