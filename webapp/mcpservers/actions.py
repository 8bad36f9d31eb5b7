"""Registering a team's MCP server: check the rule, take a place in the inspection pool, write the row, queue
its inspection on commit.

Inspections have a queue of their own (``inspect``), so a server that never starts never holds a worker that
training jobs wait for; places in it are counted in Redis like "try it" calls (``webapp.registry.tryslots``):
at most ``AGENTFLY_MCP_INSPECT_POOL`` at once, ``AGENTFLY_MCP_INSPECT_TEAM_CONCURRENCY`` per team, each
given back when its inspection ends and forgotten after its hard timeout in any case.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction

from webapp.accounts.models import Team
from webapp.mcpservers.models import MCPServer, Status, Transport
from webapp.mcpservers.rules import check_url, stdio_argv
from webapp.registry.tryslots import release_slot, take_slot


class TooManyInspections(Exception):
    """The inspection pool, or the team's share of it, is full (HTTP 429); the message names the setting."""


def hard_limit() -> float:
    """Seconds after which a worker stops an inspection whatever it is doing (Celery's hard time limit)."""
    return float(settings.AGENTFLY_MCP_INSPECT_TIMEOUT) + 30.0


def take_inspection_slot(team: Team, user: Any) -> dict[str, Any]:
    """A place for one inspection of ``team``'s server, or TooManyInspections naming the limit reached."""
    prefix = f"{settings.REDIS_PREFIX}agentfly:mcp-inspections"
    team_limit, pool = settings.AGENTFLY_MCP_INSPECT_TEAM_CONCURRENCY, settings.AGENTFLY_MCP_INSPECT_POOL
    keys = [f"{prefix}:pool", f"{prefix}:team:{team.pk}", f"{prefix}:user:{getattr(user, 'pk', None)}"]
    full, slot = take_slot(keys, (pool, team_limit, team_limit), hard_limit() + 60.0)
    if full in (2, 3):
        raise TooManyInspections(
            f"Team {team.slug} already has {team_limit} MCP server inspection(s) running; register again when it "
            f"ends (at most AGENTFLY_MCP_INSPECT_TEAM_CONCURRENCY={team_limit} per team, each stopped after "
            f"AGENTFLY_MCP_INSPECT_TIMEOUT={settings.AGENTFLY_MCP_INSPECT_TIMEOUT:g} s).")
    if full == 1:
        raise TooManyInspections(f"All {pool} MCP inspection places of this server are in use; register again in a "
                                 f"minute (AGENTFLY_MCP_INSPECT_POOL={pool}).")
    return slot


def do_register_server(*, user: object, team: Team, name: str, transport: str, command: list[str] | None = None,
                       url: str = "", reset_tool: str = "", seed_tool: str = "") -> MCPServer:
    """Register (or re-register) ``name`` for ``team``; NotAllowed when the rule refuses it, TooManyInspections
    when the team's inspections (or the server's) are at their limit."""
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
    slot = take_inspection_slot(team, user)
    try:
        with transaction.atomic():
            server, _ = MCPServer.objects.update_or_create(
                team=team, name=name,
                defaults={"transport": transport, "command": list(command or []), "url": url,
                          "status": Status.PENDING, "error": "", "created_by": user, "reset_tool": reset_tool,
                          "seed_tool": seed_tool})
            transaction.on_commit(lambda: queue_inspection(server.pk, slot))
    except BaseException:
        release_slot(slot)
        raise
    return server


def queue_inspection(server_id: int, slot: dict[str, Any] | None = None) -> None:
    """Send the inspection to the ``inspect`` queue with its timeout; the task gives ``slot`` back when done."""
    from webapp.mcpservers.tasks import inspect_mcp_server

    timeout = float(settings.AGENTFLY_MCP_INSPECT_TIMEOUT)
    inspect_mcp_server.apply_async(args=[server_id], kwargs={"slot": slot, "timeout": timeout}, queue="inspect",
                                   soft_time_limit=timeout + 15, time_limit=hard_limit())


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

    slot = acquire_slot(getattr(user, "pk", None), server.team_id)  # type: ignore[arg-type]  # a member's pk
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
