"""The "try it" pool's places in Redis: taken by the web process, given back by whoever sees the call end.

See ``webapp.registry.trying`` for the limits and why a place is held until the call ends on the worker. This
module imports neither the tasks nor the views, so the worker's task and the web process both use it.
"""

from __future__ import annotations

import functools
import time
import uuid
from typing import Any

from django.conf import settings


class TooManyTries(Exception):
    """A limit of the "try it" pool is reached (HTTP 429); the message names the setting."""


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
    full, slot = take_slot(slot_keys(user_id, team_id), (pool, team_limit, user_limit), longest_call())
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
    return slot


def take_slot(keys: list[str], limits: tuple[int, int, int], seconds: float) -> tuple[int, dict[str, Any]]:
    """Take a place in each of ``keys`` (a pool's, a team's, a user's: at most ``limits`` at once), held for
    ``seconds`` unless given back sooner; return 0 and the slot, or the 1-based index of the first full key
    (the user's checked first). Another bounded pool (MCP inspections) counts its places the same way."""
    token, now = uuid.uuid4().hex, time.time()
    full = int(_redis().eval(_ACQUIRE, 3, *keys, now, now + seconds, token, *limits))
    return full, {"keys": keys, "token": token}


def release_slot(slot: dict[str, Any] | None) -> None:
    """Give a slot back (idempotent: the worker and the web process may both do it)."""
    if not slot:
        return
    with _redis().pipeline(transaction=True) as pipe:
        for key in slot["keys"]:
            pipe.zrem(key, slot["token"])
        pipe.execute()
