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


class NoAnswer(Exception):
    """No worker on the ``try`` queue answered within ``AGENTFLY_TRY_TIMEOUT``."""


def do_try_tool(*, user: object, server: MCPServer, tool: str, arguments: dict[str, object]) -> dict[str, object]:
    """Call ``tool`` of a ready ``server`` on a ``try`` worker: ``{"observation", "error", "latency"}``.

    The call holds a place in the bounded "try it" pool, charged to the server's team
    (``webapp.registry.trying``); TooManyTries when that pool is full, NoAnswer when no worker answered in
    time. The page and the API both call this, so they answer alike."""
    from celery.exceptions import TimeoutError as CeleryTimeout
    from django.conf import settings

    from webapp.mcpservers.tasks import try_mcp_tool
    from webapp.registry.tryslots import acquire_slot, release_slot

    slot = acquire_slot(getattr(user, "pk", None), server.team_id)
    try:
        pending = try_mcp_tool.apply_async(args=[server.pk, tool, arguments], queue="try",
                                           time_limit=settings.AGENTFLY_CHILD_TIMEOUT + 15)
        result = pending.get(timeout=settings.AGENTFLY_TRY_TIMEOUT, propagate=False)
    except CeleryTimeout:
        raise NoAnswer("no worker answered in time") from None
    finally:
        release_slot(slot)
    if not isinstance(result, dict):
        return {"observation": "", "error": f"the worker failed to run the call: {result!r}", "latency": 0.0}
    return result
