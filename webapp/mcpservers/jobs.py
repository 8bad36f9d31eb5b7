"""A job's MCP servers: what the launch form stores, and what the worker runs.

The form stores each server whose tools were chosen under ``mcp.<name>`` of the job's config as registered
(its command relative to the team's plugin folder, or its URL) with the chosen tools. The worker never
runs that as written: ``for_job`` finds the team's registered server of that name, checks the rule again
(``webapp.mcpservers.rules``: a setting may have changed since), and gives the trainer the argv or URL the
rule allows, with the network the operator allows it. A name that is no ready server of the job's team
(a config written behind the API) fails the job with the reason.
"""

from __future__ import annotations

from typing import Any

from webapp.mcpservers.models import MCPServer, Status, Transport
from webapp.mcpservers.rules import NotAllowed, allowed_launch


def stored_config(server: MCPServer, tools: list[str]) -> dict[str, Any]:
    """``mcp.<name>`` of a job's stored config for ``server`` and the chosen ``tools``, as the form writes it."""
    entry: dict[str, Any] = ({"command": list(server.command)} if server.transport == Transport.STDIO
                             else {"url": server.url})
    entry["tools"] = list(tools)
    entry |= {key: value for key in ("reset_tool", "seed_tool") if (value := getattr(server, key))}
    return entry


def for_job(config: dict[str, Any], team: Any) -> dict[str, Any]:
    """``config`` with each MCP server as the trainer runs it; NotAllowed names a server the rule refuses."""
    servers = config.get("mcp") or {}
    if not servers:
        return config
    if not isinstance(servers, dict):
        raise NotAllowed("mcp must map server names to their settings")
    rows = {s.name: s for s in MCPServer.objects.filter(team=team, name__in=list(servers), status=Status.READY)}
    ran: dict[str, Any] = {}
    for name, entry in servers.items():
        server = rows.get(name)
        if server is None:
            raise NotAllowed(f"MCP server {name!r} is not a ready server of team {team.slug}: register it (or "
                             "wait for its inspection), then launch the job again")
        tools = (entry or {}).get("tools") if isinstance(entry, dict) else None
        ran[name] = {**allowed_launch(server), "tools": tools if tools is not None else server.model_tools,
                     "reset_tool": server.reset_tool or None, "seed_tool": server.seed_tool or None}
    return {**config, "mcp": ran}
