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
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any


class RateLimiter:
    """A token bucket plus a concurrency bound. Options: ``rate`` (per second), ``burst``, ``concurrency``."""

    kind = "api"

    def __init__(self, spec: Any = None, *, rate: float | None = None, burst: int | None = None,
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
        self.closed = False

    async def start(self) -> None:
        self.lock = asyncio.Lock()  # FIFO: asyncio.Lock wakes waiters in arrival order
        self.inflight = asyncio.Semaphore(self.concurrency)

    def _refill(self) -> None:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now

    async def acquire_token(self) -> None:
        """Wait until a request may be sent under the rate limit, and spend one token."""
        if self.lock is None or self.closed:
            raise RuntimeError("the rate limiter is not started (or was closed); acquire it from a ResourceEngine")
        start = time.monotonic()
        async with self.lock:  # one waiter at a time takes the next token: first come, first served
            self._refill()
            if self.tokens < 1:
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

    def isolation(self) -> dict[str, Any]:
        """Shown in the pool stats: the configured limits."""
        return {"rate_per_s": self.rate, "burst": self.burst, "concurrency": self.concurrency}
