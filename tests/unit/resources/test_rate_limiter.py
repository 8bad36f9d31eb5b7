"""RateLimiter as a global resource: the whole job keeps to one rate and one concurrency bound."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentfly.context import RolloutContext
from agentfly.resources import ResourceEngine, ResourceSpec
from agentfly.resources.ratelimit import RateLimiter

API = ResourceSpec(name="api", factory=RateLimiter, scope="global", options={"rate": 50, "burst": 5, "concurrency": 3})


async def test_rollouts_sharing_a_limiter_stay_under_its_rate_and_concurrency() -> None:
    in_flight = peak = 0
    sent: list[float] = []

    async def rollout(i: int, engine: ResourceEngine) -> None:
        nonlocal in_flight, peak
        ctx = RolloutContext(sample={}, rollout_id=str(i), group_id="g", resources=engine)
        try:
            api = await ctx.resource("api")
            for _ in range(2):
                async with api.slot():
                    sent.append(time.monotonic())
                    in_flight += 1
                    peak = max(peak, in_flight)
                    await asyncio.sleep(0.01)
                    in_flight -= 1
        finally:
            await ctx.aclose()

    async with ResourceEngine([API]) as engine:
        await asyncio.gather(*(rollout(i, engine) for i in range(15)))
        stats = engine.stats()["api"]
        limiter = engine.pools["api"].current.resource
    assert len(sent) == 30 and peak == 3  # the burst fills the three slots at once, never more
    # 5 requests from the burst, the other 25 paid for by refills at 50/s, some after sleeping for one.
    assert limiter.requests == 30 and limiter.refilled >= 25 - 1e-9 and limiter.token_waits > 0
    assert 0 <= limiter.tokens <= 5
    assert stats["kind"] == "api" and stats["in_use"] == 0 and stats["isolation"]["rate_per_s"] == 50


def test_a_limiter_with_a_rate_of_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="rate must be positive"):
        RateLimiter(rate=0)
