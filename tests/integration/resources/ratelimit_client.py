"""One process using a rate-limited API the way a rank, the producer or an evaluation would:
``python ratelimit_client.py URL KEY REDIS_URL N`` sends N requests through ``SharedRateLimiter`` (8 per second, bursts of 2, 3 at once)
and prints how many came back 200."""

from __future__ import annotations

import asyncio
import sys

from agentfly.resources.ratelimit import SharedRateLimiter


async def main(url: str, key: str, redis_url: str, n: int) -> None:
    api = SharedRateLimiter(key=key, redis_url=redis_url, rate=8, burst=2, concurrency=3, max_retries=6)
    await api.start()
    try:
        async def one(_: int) -> int:
            return int((await api.request("GET", url)).status_code)

        codes = await asyncio.gather(*(one(i) for i in range(n)))
        print(sum(1 for c in codes if c == 200))
    finally:
        await api.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
