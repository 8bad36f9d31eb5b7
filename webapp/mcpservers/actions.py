"""Registering a team's MCP server: check the rule, write the row, queue its inspection on commit."""

from __future__ import annotations

from django.db import transaction

from webapp.accounts.models import Team
from webapp.mcpservers.models import MCPServer, Status, Transport
from webapp.mcpservers.rules import check_url, stdio_argv


def do_register_server(*, user: object, team: Team, name: str, transport: str, command: list[str] | None = None,
                       url: str = "", reset_tool: str = "", seed_tool: str = "") -> MCPServer:
    """Register (or re-register) ``name`` for ``team``; NotAllowed when the rule refuses it."""
    if not team.has_member(user):
        raise PermissionError("you can only register MCP servers for a team you belong to")
    if transport == Transport.STDIO:
        stdio_argv(team.slug, list(command or []))
        url = ""
    elif transport == Transport.HTTP:
        check_url(url)
        command = []
    else:
        raise ValueError(f"Unknown transport: {transport!r}; use 'stdio' or 'http'")
    with transaction.atomic():
        server, _ = MCPServer.objects.update_or_create(
            team=team, name=name,
            defaults={"transport": transport, "command": list(command or []), "url": url, "status": Status.PENDING,
                      "error": "", "created_by": user, "reset_tool": reset_tool, "seed_tool": seed_tool})
        transaction.on_commit(lambda: queue_inspection(server.pk))
    return server


def queue_inspection(server_id: int) -> None:
    from webapp.mcpservers.tasks import inspect_mcp_server

    inspect_mcp_server.apply_async(args=[server_id], queue="cpu")
