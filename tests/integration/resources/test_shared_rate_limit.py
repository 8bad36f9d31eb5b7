"""A rate-limited API shared by four processes through Redis, against a real HTTP server on loopback that
enforces its limit (429 with ``Retry-After``) and records when each request arrived."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentfly.resources import InfrastructureFailure
from agentfly.resources.ratelimit import SharedRateLimiter
from tests.provider_api import ProviderAPI, most_in_one_second, serving

redis = pytest.importorskip("redis")
pytest.importorskip("httpx")

REDIS_URL = "redis://127.0.0.1:6379/12"
CLIENT = Path(__file__).with_name("ratelimit_client.py")
ROOT = Path(__file__).resolve().parents[3]
RATE = 10  # requests per second the provider allows (over any 1 s window, plus a burst of 2)
# The clients ask for 8/s with bursts of 2: at most 10 taken in any second, headroom for the jitter between
# taking a token and the request reaching the server.
CLIENT_RATE = 8


@pytest.fixture
def api_server() -> Iterator[ProviderAPI]:
    try:
        redis.Redis.from_url(REDIS_URL).ping()
    except Exception:
        pytest.skip("needs Redis on 127.0.0.1:6379")
    with serving(limit=RATE + 2) as server:  # 200 while fewer than RATE + 2 arrived in the last second
        yield server


@pytest.mark.slow
def test_four_processes_never_exceed_the_rate_in_aggregate_measured_at_the_server(api_server: ProviderAPI) -> None:
    url = f"http://127.0.0.1:{api_server.server_address[1]}/search"
    key = f"test-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    # Four OS processes, as two ranks, the producer and an evaluation would be: 4 x 12 requests at 8/s.
    procs = [subprocess.Popen([sys.executable, str(CLIENT), url, key, REDIS_URL, "12"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outputs]
    assert sum(int(o[0].strip()) for o in outputs) == 48
    assert len(api_server.arrivals) == 48
    assert api_server.rejected == 0  # the shared budget kept every process inside the provider's limit
    # Never more than the rate plus the burst in any one second, all four processes together.
    assert most_in_one_second(api_server.arrivals) <= RATE + 2
    span = max(api_server.arrivals) - min(api_server.arrivals)
    assert span >= (48 - 2) / CLIENT_RATE * 0.9  # paced, not merely lucky


async def test_a_429_is_retried_after_its_retry_after(api_server: ProviderAPI) -> None:
    url = f"http://127.0.0.1:{api_server.server_address[1]}/search"
    # This limiter believes the provider allows far more than it does: the server's 429s pace it.
    api = SharedRateLimiter(key=f"test-{uuid.uuid4().hex[:8]}", redis_url=REDIS_URL, rate=1000, burst=1000,
                            concurrency=50, max_retries=6)
    await api.start()
    try:
        codes = [r.status_code for r in await asyncio.gather(*(api.request("GET", url) for _ in range(4 * RATE)))]
        stats = await api.stats()
    finally:
        await api.close()
    assert codes == [200] * (4 * RATE)
    assert api_server.rejected >= 1 and stats["http_429"] >= 1
    # Each rejected request waited the server's Retry-After (1 s) before its retry, no less.
    assert stats["retry_wait_seconds"] == pytest.approx(1.0 * stats["http_429"])
    assert stats["breaker"] == "closed"  # a 429 is pacing, not a failure


async def test_the_pool_stats_show_calls_waits_429s_quota_and_breaker(api_server: ProviderAPI) -> None:
    from agentfly.resources import Pool, ResourceEngine, ResourceSpec

    url = f"http://127.0.0.1:{api_server.server_address[1]}/search"
    spec = ResourceSpec(name="search_api", factory=SharedRateLimiter, kind="api", scope="global", pool=Pool(0, 1),
                        options={"key": f"test-{uuid.uuid4().hex[:8]}", "redis_url": REDIS_URL, "rate": 20,
                                 "burst": 5, "daily_quota": 100, "snapshot_every": 0})
    async with ResourceEngine([spec]) as engine:
        lease = await engine.acquire("search_api")
        # Eight at once against a burst of five: three must wait for tokens however fast the server answers.
        await asyncio.gather(*(lease.instance.request("GET", url) for _ in range(8)))
        await engine.release(lease)
        stats = engine.stats()
    json.dumps(stats)  # the pool stats travel in the job's resources event as they are
    shown = stats["search_api"]["isolation"]
    assert shown["calls"] == 8 and shown["waits"] >= 1 and shown["http_429"] == 0
    assert shown["quota_used"] == 8 and shown["daily_quota"] == 100 and shown["breaker"] == "closed"


async def test_a_server_that_goes_down_opens_the_breaker() -> None:
    try:
        redis.Redis.from_url(REDIS_URL).ping()
    except Exception:
        pytest.skip("needs Redis on 127.0.0.1:6379")
    import socket

    with socket.socket() as s:  # a port nothing listens on: the server is down
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    key = f"test-{uuid.uuid4().hex[:8]}"
    api = SharedRateLimiter(key=key, redis_url=REDIS_URL, rate=100, burst=100, max_retries=1, backoff=0.01,
                            breaker_failures=3, breaker_cooldown=30)
    other = SharedRateLimiter(key=key, redis_url=REDIS_URL, rate=100, burst=100)  # another process's view
    await api.start()
    await other.start()
    try:
        with pytest.raises(InfrastructureFailure) as first:
            await api.request("GET", f"http://127.0.0.1:{port}/")
        assert first.value.kind == "server_down"
        with pytest.raises(InfrastructureFailure) as second:
            await api.request("GET", f"http://127.0.0.1:{port}/")
        assert second.value.kind == "breaker_open"  # the third failure opened it; the retry met it open
        with pytest.raises(InfrastructureFailure) as shared:
            await other.request("GET", f"http://127.0.0.1:{port}/")
        assert shared.value.kind == "breaker_open"  # the breaker is shared, like the budget
        assert (await other.stats())["breaker"] == "open"
    finally:
        await api.close()
        await other.close()
