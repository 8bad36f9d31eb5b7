"""A "try it" call from the web process: a slot under the user's concurrency limit, then the ``try`` queue.

Tries run on their own Celery queue (``try``), so a deployment can give them their own worker, and each
user may have at most ``AGENTFLY_TRY_CONCURRENCY`` in flight. The count lives in Redis (a sorted set of
call tokens per user), so the limit holds across every web process; a slot whose web process died is
forgotten once it is older than the longest a call can wait.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery.exceptions import TimeoutError as CeleryTimeout
from django.conf import settings


class TooManyTries(Exception):
    """The user already has ``AGENTFLY_TRY_CONCURRENCY`` calls running (HTTP 429)."""


class NoAnswer(Exception):
    """No worker answered within ``AGENTFLY_TRY_TIMEOUT`` (HTTP 504 in the API)."""


@functools.cache
def _redis() -> Any:
    import redis

    return redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=5, socket_timeout=5)


@contextmanager
def try_slot(user_id: int) -> Iterator[None]:
    """Hold one of the user's "try it" slots while the block runs; TooManyTries when none is free."""
    limit = settings.AGENTFLY_TRY_CONCURRENCY
    key = f"{settings.REDIS_PREFIX}agentfly:try-slots:{user_id}"
    token, now = uuid.uuid4().hex, time.time()
    longest = settings.AGENTFLY_TRY_TIMEOUT + 60
    r = _redis()
    with r.pipeline(transaction=True) as pipe:  # one MULTI/EXEC: two web processes cannot both take the last slot
        pipe.zremrangebyscore(key, "-inf", now - longest)
        pipe.zadd(key, {token: now})
        pipe.zcard(key)
        pipe.expire(key, int(longest) + 60)
        taken = pipe.execute()[2]
    try:
        if taken > limit:
            raise TooManyTries(f"You already have {limit} \"try it\" calls running; wait for one to finish "
                               f"(at most AGENTFLY_TRY_CONCURRENCY={limit} per user at a time).")
        yield
    finally:
        r.zrem(key, token)


def try_on_worker(user_id: int, entry_id: int, arguments: dict[str, Any]) -> dict[str, Any]:
    """Run the tool on a ``try`` worker and return ``{"observation", "error", "latency"}``; TooManyTries when
    the user is at the limit, NoAnswer when no worker answered in time. A failed task is an error result."""
    from webapp.registry.tasks import try_tool

    with try_slot(user_id):
        pending = try_tool.apply_async(args=[entry_id, arguments], queue="try")
        try:
            result = pending.get(timeout=settings.AGENTFLY_TRY_TIMEOUT, propagate=False)
        except CeleryTimeout:
            pending.revoke()  # nobody waits for it any more
            raise NoAnswer(f"no worker answered within {settings.AGENTFLY_TRY_TIMEOUT:g} s; is a worker running "
                           "on the try queue?") from None
    if not isinstance(result, dict):  # the task itself failed (its exception is the result)
        return {"observation": "", "latency": 0.0, "error": f"the worker failed to run the call: {result!r}"}
    return result
