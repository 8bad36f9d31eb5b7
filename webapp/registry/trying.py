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

import functools
import time
import uuid
from typing import Any

from celery.exceptions import TimeoutError as CeleryTimeout
from django.conf import settings


class TooManyTries(Exception):
    """A limit of the "try it" pool is reached (HTTP 429); the message names the setting."""


class NoAnswer(Exception):
    """No worker answered within ``AGENTFLY_TRY_TIMEOUT`` (HTTP 504 in the API)."""


@functools.cache
def _redis() -> Any:
    import redis

    return redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=5, socket_timeout=5)


# KEYS: pool, team, user. ARGV: now, expiry, token, pool limit, team limit, user limit.
# Returns 0 when the slot is taken, else the 1-based index of the first full key (user checked first).
_ACQUIRE = """
for i = 1, 3 do redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', ARGV[1]) end
if redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[6]) then return 3 end
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[5]) then return 2 end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return 1 end
for i = 1, 3 do
  redis.call('ZADD', KEYS[i], ARGV[2], ARGV[3])
  redis.call('EXPIRE', KEYS[i], math.ceil(ARGV[2] - ARGV[1]) + 60)
end
return 0
"""


def longest_call() -> float:
    """Seconds after which a slot is forgotten: a call cannot outlast its wait plus its child's hard timeout."""
    return float(settings.AGENTFLY_TRY_TIMEOUT + settings.AGENTFLY_CHILD_TIMEOUT + 30)


def slot_keys(user_id: int, team_id: int | None) -> list[str]:
    prefix = f"{settings.REDIS_PREFIX}agentfly:try-slots"
    return [f"{prefix}:pool", f"{prefix}:team:{team_id or 'none'}", f"{prefix}:user:{user_id}"]


def acquire_slot(user_id: int, team_id: int | None) -> dict[str, Any]:
    """Take a slot for one call, or TooManyTries naming the limit that is reached."""
    user_limit = settings.AGENTFLY_TRY_CONCURRENCY
    team_limit = settings.AGENTFLY_TRY_TEAM_CONCURRENCY
    pool = settings.AGENTFLY_TRY_POOL
    keys, token, now = slot_keys(user_id, team_id), uuid.uuid4().hex, time.time()
    full = int(_redis().eval(_ACQUIRE, 3, *keys, now, now + longest_call(), token, pool, team_limit, user_limit))
    if full == 3:
        raise TooManyTries(f"You already have {user_limit} \"try it\" calls running; wait for one to finish "
                           f"(at most AGENTFLY_TRY_CONCURRENCY={user_limit} per user at a time; a call that loops "
                           f"holds its place until it is stopped after AGENTFLY_CHILD_TIMEOUT="
                           f"{settings.AGENTFLY_CHILD_TIMEOUT:g} s).")
    if full == 2:
        raise TooManyTries(f"Your team already has {team_limit} \"try it\" calls running; wait for one to finish "
                           f"(at most AGENTFLY_TRY_TEAM_CONCURRENCY={team_limit} per team at a time).")
    if full == 1:
        raise TooManyTries(f"All {pool} \"try it\" places of this server are in use; try again in a few seconds "
                           f"(AGENTFLY_TRY_POOL={pool}).")
    return {"keys": keys, "token": token}


def release_slot(slot: dict[str, Any] | None) -> None:
    """Give a slot back (idempotent: the worker and the web process may both do it)."""
    if not slot:
        return
    with _redis().pipeline(transaction=True) as pipe:
        for key in slot["keys"]:
            pipe.zrem(key, slot["token"])
        pipe.execute()


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
