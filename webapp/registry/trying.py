"""A "try it" call from the web process: a slot in the bounded "try it" pool, then the ``try`` queue.

"Try it" runs user code, which may loop. Three limits, checked together in one Redis script so every web
process sees the same counts:

- ``AGENTFLY_TRY_POOL`` calls at once on the whole server: the ``try`` workers' total concurrency, so an
  admitted call starts at once instead of queueing behind others (run ``celery -A webapp worker -Q try -c N``
  with N at least this);
- ``AGENTFLY_TRY_TEAM_CONCURRENCY`` per team (the team whose entry is tried; a built-in is charged to the
  caller's first team) and ``AGENTFLY_TRY_CONCURRENCY`` per user. With the pool larger than one team's
  share, one team's loops leave room for another team's call.

A slot is held until the call ends **on the worker**, not until the web process stops waiting: a loop that
made the user's request time out still holds its slot until its child is killed (``AGENTFLY_CHILD_TIMEOUT``,
the hard timeout, enforced again by the task's Celery ``time_limit``), so looping calls cannot pile up on
the workers. A slot whose holder died is forgotten once it is older than the longest a call can last.
"""

from __future__ import annotations

from typing import Any

from celery.exceptions import TimeoutError as CeleryTimeout
from django.conf import settings

from webapp.registry.tryslots import TooManyTries, acquire_slot, release_slot

__all__ = ["NoAnswer", "TooManyTries", "charged_team", "not_triable", "try_on_worker"]


class NoAnswer(Exception):
    """No worker answered within ``AGENTFLY_TRY_TIMEOUT`` (HTTP 504 in the API)."""


def not_triable(what: str, status: str, has_version: bool) -> str | None:
    """Why a tool (``what``: "This tool", "This server") cannot be tried now, or None when it can: it is
    inspecting or failed, or it is ready but no inspected version is kept (one was deleted)."""
    if status != "ready":
        return f"{what} is {status}; it can be tried once its inspection has succeeded."
    if not has_version:
        return (f"{what} has no inspected version to try (its last one was deleted); register it again to have it "
                "inspected, then try it.")
    return None


def charged_team(entry: Any, user: Any) -> int | None:
    """The team a call counts against: the entry's, or for a built-in the caller's first team."""
    if entry.team_id is not None:
        return int(entry.team_id)
    from webapp.accounts.models import Team

    return Team.objects.of(user).order_by("pk").values_list("pk", flat=True).first()


def try_on_worker(user_id: int, entry_id: int, arguments: dict[str, Any], team_id: int | None = None) -> dict[str, Any]:
    """Run the tool on a ``try`` worker and return ``{"observation", "error", "latency"}``; TooManyTries when a
    limit is reached, NoAnswer when no worker answered in time. A failed task is an error result."""
    from webapp.registry.tasks import try_tool

    slot = acquire_slot(user_id, team_id)
    try:
        # The hard timeout: the child is killed at AGENTFLY_CHILD_TIMEOUT; the task itself a little later.
        pending = try_tool.apply_async(args=[entry_id, arguments], kwargs={"slot": slot}, queue="try",
                                       time_limit=settings.AGENTFLY_CHILD_TIMEOUT + 15)
    except BaseException:
        release_slot(slot)
        raise
    try:
        result = pending.get(timeout=settings.AGENTFLY_TRY_TIMEOUT, propagate=False)
    except CeleryTimeout:
        if pending.state == "PENDING":  # never started: it will not run, so nothing holds the slot
            pending.revoke()
            release_slot(slot)
        # else the worker still runs it and gives the slot back when its child ends or is killed
        raise NoAnswer(f"no worker answered within {settings.AGENTFLY_TRY_TIMEOUT:g} s; is a worker running "
                       "on the try queue?") from None
    release_slot(slot)  # the worker did already, unless it died running the call
    if not isinstance(result, dict):  # the task itself failed (its exception is the result)
        return {"observation": "", "latency": 0.0, "error": f"the worker failed to run the call: {result!r}"}
    return result
