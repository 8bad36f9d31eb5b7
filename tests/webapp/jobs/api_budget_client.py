"""One process of a job using its team's rate-limited API, as a rank, the producer or an evaluation does:

    python api_budget_client.py CONFIG.json URL N

builds the job's pools from its config as the worker rewrote it (``trainer.builders.build_resources``), with
the Redis URL of ``AGENTFLY_RATELIMIT_REDIS`` (the team's user, as in a job's sandbox), prints ``ready``,
waits for a line on stdin (so every process starts sending at once), sends N requests through the API
resource and prints how many came back 200."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from trainer.builders import build_resources
from trainer.config import Config, from_dict


async def main(path: str, url: str, n: int) -> None:
    config = from_dict(Config, json.loads(Path(path).read_text()))
    engine = build_resources(config, [])
    assert engine is not None
    async with engine:
        lease = await engine.acquire(next(iter(config.resources)))
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        responses = await asyncio.gather(*(lease.instance.request("GET", url) for _ in range(n)))
        await engine.release(lease)
    print(sum(1 for r in responses if r.status_code == 200), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
