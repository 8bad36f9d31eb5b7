"""``RateLimiter``: the shared budget of a rate-limited API (a web search service, a hosted judge model).

Declared as a global resource, one limiter is shared by every rollout of the job, so the job as a whole
keeps to the provider's limits however many rollouts run at once:

    SEARCH_API = ResourceSpec(name="search_api", factory=RateLimiter, kind="api", scope="global",
                              options={"rate": 5, "burst": 10, "concurrency": 4})

    @tool(resource="search_api")
    async def web_search(query: str, context) -> str:
        api = await context.resource("search_api")
        async with api.slot():              # waits for a token and a free connection
            return await call_the_service(query)

Tokens refill continuously at ``rate`` per second up to ``burst`` (a token bucket); ``concurrency`` bounds the
requests in flight. Waiters are served in arrival order.

Why not a rate-limit library (``limits`` 5.x, ``pyrate-limiter`` 4.x, ``aiolimiter``), checked against what the
shared budget must keep:

- one atomic step takes a token, a connection slot (a lease in a sorted set that expires if its holder dies)
  and a unit of the daily quota, or none of them; the libraries limit a rate (fixed, moving or sliding
  windows, a leaky bucket) and have no concurrency slots or quota in the same step, so two of their calls
  plus ours would let two processes both spend the last token of one and the last slot of the other;
- a team's jobs reach Redis as a user limited to ``REDIS_COMMANDS`` on the team's keys, with no ``EVAL`` or
  ``SCRIPT LOAD`` (a Lua loop would stall the server for every team): the web app loads our two scripts
  (``SCRIPTS``) with its own connection, while the libraries' Redis storages load theirs on first use;
- the clock is Redis's own (``TIME``), so hosts whose clocks disagree still share one bucket;
- the in-process ``RateLimiter`` is a token bucket with a burst, FIFO waiters and a concurrency bound in a
  few dozen lines, which ``aiolimiter`` (a leaky bucket without a concurrency bound) would not make shorter.
The measured behaviour (tests/integration/resources/test_shared_rate_limit.py: four processes never exceed
the rate in aggregate, measured at the server) is this code's.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

    from agentfly.resources.spec import ResourceSpec


class RateLimiter:
    """A token bucket plus a concurrency bound. Options: ``rate`` (per second), ``burst``, ``concurrency``."""

    kind = "api"

    def __init__(self, spec: ResourceSpec | None = None, *, rate: float | None = None, burst: int | None = None,
                 concurrency: int | None = None) -> None:
        options = dict(getattr(spec, "options", None) or {})
        self.rate = float(rate if rate is not None else options.get("rate", 10.0))
        self.burst = int(burst if burst is not None else options.get("burst", max(1, round(self.rate))))
        self.concurrency = int(concurrency if concurrency is not None else options.get("concurrency", 8))
        if self.rate <= 0 or self.burst < 1 or self.concurrency < 1:
            raise ValueError(
                f"RateLimiter(rate={self.rate}, burst={self.burst}, concurrency={self.concurrency}): rate must be "
                "positive, burst and concurrency at least 1"
            )
        self.tokens = float(self.burst)
        self.updated = time.monotonic()
        self.lock: asyncio.Lock | None = None
        self.inflight: asyncio.Semaphore | None = None
        self.requests = 0
        self.waited = 0.0
        # The bucket's ledger: tokens added by refills at ``rate`` (never above ``burst``) and the requests that
        # found it empty and slept for one. ``requests <= burst + refilled`` always: what pacing means.
        self.refilled = 0.0
        self.token_waits = 0
        self.closed = False

    async def start(self) -> None:
        self.lock = asyncio.Lock()  # FIFO: asyncio.Lock wakes waiters in arrival order
        self.inflight = asyncio.Semaphore(self.concurrency)

    def _refill(self) -> None:
        now = time.monotonic()
        before = self.tokens
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.refilled += self.tokens - before
        self.updated = now

    async def acquire_token(self) -> None:
        """Wait until a request may be sent under the rate limit, and spend one token."""
        if self.lock is None or self.closed:
            raise RuntimeError("the rate limiter is not started (or was closed); acquire it from a ResourceEngine")
        start = time.monotonic()
        async with self.lock:  # one waiter at a time takes the next token: first come, first served
            self._refill()
            if self.tokens < 1:
                self.token_waits += 1
                await asyncio.sleep((1 - self.tokens) / self.rate)
                self._refill()
            self.tokens -= 1
        self.requests += 1
        self.waited += time.monotonic() - start

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one request's worth of the budget: a token and one of ``concurrency`` connections."""
        assert self.inflight is not None
        async with self.inflight:
            await self.acquire_token()
            yield

    async def reset(self) -> None:
        """Shared and stateless between rollouts: nothing to reset."""

    async def health(self) -> bool:
        return not self.closed

    async def close(self) -> None:
        self.closed = True

    def kill(self) -> None:
        self.closed = True

    def isolation(self) -> dict[str, object]:
        """Shown in the pool stats: the configured limits."""
        return {"rate_per_s": self.rate, "burst": self.burst, "concurrency": self.concurrency}


# --------------------------------------------------------------------------- a budget shared across processes
# Every state change is one Lua script, so concurrent processes never both spend the last token: Redis runs a
# script atomically. Time is Redis's own clock (TIME), so the processes' clocks need not agree.
_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rate, burst, quota = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local lease_id, slots, lease_ms = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
if redis.call('PTTL', KEYS[4]) > 0 then return {-3, redis.call('PTTL', KEYS[4])} end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
if redis.call('ZCARD', KEYS[3]) >= slots then return {-2, 20} end
if quota > 0 and tonumber(redis.call('GET', KEYS[2]) or '0') >= quota then return {-1, 0} end
local b = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens, at = tonumber(b[1]) or burst, tonumber(b[2]) or now
tokens = math.min(burst, tokens + (now - at) * rate / 1000)
if tokens < 1 then
  redis.call('HSET', KEYS[1], 'tokens', tokens, 'at', now)
  return {-2, math.ceil((1 - tokens) * 1000 / rate)}
end
redis.call('HSET', KEYS[1], 'tokens', tokens - 1, 'at', now)
redis.call('PEXPIRE', KEYS[1], 86400000)
redis.call('ZADD', KEYS[3], now + lease_ms, lease_id)
if quota > 0 then
  redis.call('INCR', KEYS[2])
  redis.call('EXPIRE', KEYS[2], 172800)
end
return {0, 0}
"""
# A failure: count it; the ``threshold``-th in a row opens the breaker for ``cooldown_ms``. A success resets.
_FAILED = """
local n = redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], 3600000)
if n >= tonumber(ARGV[1]) then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
  redis.call('DEL', KEYS[1])
  redis.call('HINCRBY', KEYS[3], 'breaker_opened', 1)
  return 1
end
return 0
"""


# Every key of a limiter is ``KEY_PREFIX + key + ":" + ...``: a Redis user limited to ``KEY_PREFIX + key + ":*"``
# (or a pattern over several keys, as the web app's per-team users are) reaches that budget and nothing else.
KEY_PREFIX = "agentfly:api:"
# The Lua scripts a limiter runs by EVALSHA. A user whose rights are only REDIS_COMMANDS cannot load a script
# (no EVAL, no SCRIPT LOAD: an endless Lua loop would stall the whole server), so whoever creates such a user
# loads these first with their own connection.
SCRIPTS = (_TAKE, _FAILED)
# The commands a limiter sends, itself and from its scripts (Redis checks a script's calls against the user's
# rights too): with ``resetchannels`` and its key pattern, all a user needs to share a budget.
REDIS_COMMANDS = ("ping", "select", "evalsha", "time", "pttl", "zremrangebyscore", "zcard", "get", "hmget", "hset",
                  "pexpire", "zadd", "incr", "expire", "set", "del", "hincrby", "hincrbyfloat", "zrem", "hgetall")


class SharedRateLimiter:
    """A provider's limits held in Redis, so every process that uses the API shares one budget.

    All ranks, the async producer, evaluations and a team's other jobs that name the same ``key`` together
    send at most ``rate`` requests per second (bursts up to ``burst``), at most ``concurrency`` at once and
    ``daily_quota`` per UTC day (0: none). ``request`` retries 429 and 503 after the server's ``Retry-After``
    (else an exponential backoff), and a circuit breaker, also in Redis, opens after ``breaker_failures``
    failures in a row: calls then raise ``InfrastructureFailure(kind="breaker_open")`` for ``breaker_cooldown``
    seconds without reaching the server.

        SEARCH = ResourceSpec(name="search_api", factory=SharedRateLimiter, kind="api", scope="global",
                              options={"key": "team-7:search", "rate": 5, "burst": 5, "concurrency": 4,
                                       "daily_quota": 10000, "redis_url": "redis://127.0.0.1:6379/0"})
        api = await context.resource("search_api")
        response = await api.request("GET", "https://search.example/api", params={"q": query})

    Counters (calls, waits, wait seconds, 429s, failures, breaker openings) live in Redis too; ``stats()``
    reads them, with the quota in use and the breaker's state, for the dashboard.
    """

    kind = "api"

    def __init__(self, spec: ResourceSpec | None = None, **overrides: Any) -> None:
        options = {**dict(getattr(spec, "options", None) or {}), **overrides}
        self.key = str(options.get("key") or getattr(spec, "name", None) or "api")
        self.redis_url = str(options.get("redis_url") or os.environ.get("AGENTFLY_RATELIMIT_REDIS")
                             or os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0")
        self.rate = float(options.get("rate", 10.0))
        self.burst = int(options.get("burst", max(1, round(self.rate))))
        self.concurrency = int(options.get("concurrency", 8))
        self.daily_quota = int(options.get("daily_quota", 0))
        self.max_retries = int(options.get("max_retries", 4))
        self.backoff = float(options.get("backoff", 0.5))
        self.max_wait = float(options.get("max_wait", 60.0))  # longest single Retry-After honoured
        self.timeout = float(options.get("timeout", 30.0))
        self.breaker_failures = int(options.get("breaker_failures", 5))
        self.breaker_cooldown = float(options.get("breaker_cooldown", 30.0))
        if self.rate <= 0 or self.burst < 1 or self.concurrency < 1 or self.breaker_failures < 1:
            raise ValueError(f"SharedRateLimiter {self.key!r}: rate must be positive; burst, concurrency and "
                             "breaker_failures at least 1")
        self.redis: Any = None
        self.client: httpx.AsyncClient | None = None
        self.closed = False
        self._serial = 0
        # The shared counters as last read from Redis (at most every ``snapshot_every`` seconds, after a call),
        # so the pool stats, which are synchronous, can show them: the resources event carries them to the
        # dashboard.
        self.snapshot: dict[str, object] = {"rate_per_s": self.rate, "burst": self.burst,
                                          "concurrency": self.concurrency, "daily_quota": self.daily_quota,
                                          "shared_in": "redis", "key": self.key}
        self.snapshot_every = float(options.get("snapshot_every", 5.0))
        self._snapshot_at = 0.0

    def _keys(self) -> dict[str, str]:
        day = time.strftime("%Y-%m-%d", time.gmtime())
        base = f"{KEY_PREFIX}{self.key}"
        return {"bucket": f"{base}:bucket", "quota": f"{base}:quota:{day}", "inflight": f"{base}:inflight",
                "breaker": f"{base}:breaker", "failures": f"{base}:failures", "stats": f"{base}:stats"}

    async def start(self) -> None:
        import httpx
        import redis.asyncio as aioredis

        self.redis = aioredis.Redis.from_url(self.redis_url)
        await self.redis.ping()
        self._take = self.redis.register_script(_TAKE)
        self._failed = self.redis.register_script(_FAILED)
        self.client = httpx.AsyncClient(timeout=self.timeout, follow_redirects=False)

    async def _count(self, **fields: float) -> None:
        stats = self._keys()["stats"]
        async with self.redis.pipeline(transaction=False) as pipe:
            for name, value in fields.items():
                pipe.hincrbyfloat(stats, name, value)
            await pipe.execute()

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one request's worth of the shared budget: a token, a connection slot and a unit of quota."""
        from agentfly.resources.spec import InfrastructureFailure

        if self.redis is None or self.closed:
            raise RuntimeError("the rate limiter is not started (or was closed); acquire it from a ResourceEngine")
        keys = self._keys()
        self._serial += 1
        lease = f"{os.getpid()}-{id(self)}-{self._serial}"
        lease_ms = int((self.timeout + 5) * 1000)  # a holder that dies frees its slot when this runs out
        start = time.monotonic()
        while True:
            code, wait_ms = await self._take(
                keys=[keys["bucket"], keys["quota"], keys["inflight"], keys["breaker"]],
                args=[self.rate, self.burst, self.daily_quota, lease, self.concurrency, lease_ms])
            if code == 0:
                break
            if code == -3:
                raise InfrastructureFailure(f"API {self.key!r}: the circuit breaker is open for another "
                                            f"{int(wait_ms) / 1000:.1f} s after repeated failures", "breaker_open")
            if code == -1:
                raise InfrastructureFailure(f"API {self.key!r}: the daily quota of {self.daily_quota} calls is "
                                            "used up", "server_down")
            await asyncio.sleep(max(int(wait_ms), 1) / 1000)
        waited = time.monotonic() - start
        await self._count(calls=1, waits=1 if waited > 0.001 else 0, wait_seconds=waited)
        try:
            yield
        finally:
            await self.redis.zrem(keys["inflight"], lease)

    async def _failure(self) -> None:
        keys = self._keys()
        await self._failed(keys=[keys["failures"], keys["breaker"], keys["stats"]],
                           args=[self.breaker_failures, int(self.breaker_cooldown * 1000)])

    async def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        """An HTTP request within the shared budget, retried on 429/503 (after ``Retry-After``) and on connection
        errors; an ``httpx.Response`` for any other status. Raises ``InfrastructureFailure`` when retries run out
        (``server_down``) or the breaker is open (``breaker_open``)."""
        import httpx

        from agentfly.resources.spec import InfrastructureFailure

        last = ""
        for attempt in range(self.max_retries + 1):
            retry_after: float | None = None
            try:
                async with self.slot():
                    assert self.client is not None  # started with the Redis client that slot() checks
                    response = await self.client.request(method, url, **kwargs)
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
                await self._count(failures=1)
                await self._failure()
            else:
                if response.status_code not in (429, 503) and response.status_code < 500:
                    await self.redis.delete(self._keys()["failures"])
                    await self._refresh()
                    return response
                last = f"HTTP {response.status_code}"
                await self._count(**{"http_429": 1} if response.status_code == 429 else {"failures": 1})
                if response.status_code != 429:  # a 429 is the provider pacing us, not a failure
                    await self._failure()
                retry_after = _retry_after(response.headers.get("Retry-After"))
            if attempt == self.max_retries:
                break
            delay = min(retry_after if retry_after is not None else self.backoff * 2 ** attempt, self.max_wait)
            await self._count(retry_wait_seconds=delay)  # what the server asked for, as it was honoured
            await asyncio.sleep(delay)
        await self._refresh()
        raise InfrastructureFailure(f"API {self.key!r}: {method} {url} failed {self.max_retries + 1} times "
                                    f"(last: {last})", "server_down")

    async def _refresh(self) -> None:
        if time.monotonic() - self._snapshot_at >= self.snapshot_every:
            self._snapshot_at = time.monotonic()
            self.snapshot.update(await self.stats())  # in place: the pool keeps the dict isolation() gave it

    async def stats(self) -> dict[str, object]:
        """Calls, waits, wait seconds, 429s, failures, breaker openings; the quota in use; the breaker's state."""
        keys = self._keys()
        raw = await self.redis.hgetall(keys["stats"])
        out: dict[str, object] = dict.fromkeys(("calls", "waits", "wait_seconds", "http_429", "failures",
                                             "breaker_opened", "retry_wait_seconds"), 0.0)
        out.update({k.decode(): float(v) for k, v in raw.items()})
        out["quota_used"] = int(await self.redis.get(keys["quota"]) or 0)
        out["daily_quota"] = self.daily_quota
        out["breaker"] = "open" if await self.redis.pttl(keys["breaker"]) > 0 else "closed"
        out["in_flight"] = int(await self.redis.zcard(keys["inflight"]))
        return out

    async def reset(self) -> None:
        """Shared across rollouts: nothing to reset."""

    async def health(self) -> bool:
        if self.closed or self.redis is None:
            return False
        try:
            return bool(await self.redis.ping())
        except Exception:
            return False

    async def close(self) -> None:
        self.closed = True
        if self.client is not None:
            await self.client.aclose()
        if self.redis is not None:
            await self.redis.aclose()

    def kill(self) -> None:
        self.closed = True

    def isolation(self) -> dict[str, object]:
        """Shown in the pool stats (and so in the resources event): the limits, and the shared counters
        (calls, waits, 429s, quota in use, breaker state) as last read."""
        return self.snapshot


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` as seconds: a number, or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    from email.utils import parsedate_to_datetime

    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None
