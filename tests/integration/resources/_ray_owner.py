"""A process of a job on the Ray cluster, for tests/integration/resources/test_ray_backend.py.

    python _ray_owner.py ADDRESS JOB hold N           # acquire N sandboxes, say HELD, then wait to be killed
    python _ray_owner.py ADDRESS JOB rank R/W FILE    # a gloo rank: 6 rollouts that each hold a sandbox 0.3 s
    python _ray_owner.py ADDRESS JOB producer         # the async producer's share: the same, without gloo
"""

from __future__ import annotations

import asyncio
import sys
import time

import ray

from agentfly.resources import Pool, ResourceEngine
from agentfly.resources.backends.ray import RaySettings, on_ray
from agentfly.resources.scratchpad import Scratchpad
from agentfly.resources.spec import ResourceSpec

MAX = 3


def spec() -> ResourceSpec:
    return on_ray(ResourceSpec(name="box", factory=Scratchpad, kind="sandbox", backend="inprocess",
                               pool=Pool(0, MAX), acquire_timeout=120, health_interval=0,
                               options={"ray": {"resources": {"sandbox": 1}}}))


async def rollouts(engine: ResourceEngine, n: int) -> int:
    async def one(i: int) -> None:
        lease = await engine.acquire("box", owner=f"r{i}")
        try:
            await asyncio.sleep(0.3)
        finally:
            await engine.release(lease)

    await asyncio.gather(*(one(i) for i in range(n)))
    return n


async def main(address: str, job: str, mode: str, args: list[str]) -> None:
    ray.init(address=address, include_dashboard=False, log_to_driver=False)
    engine = ResourceEngine([spec()], ray=RaySettings(address=address, job=job, lease_check_interval=0.5,
                                                      orphan_timeout=60))
    await engine.start()
    if mode == "hold":
        leases = [await engine.acquire("box", owner=f"r{i}") for i in range(int(args[0]))]
        print("HELD", " ".join(lease.instance.node for lease in leases), flush=True)
        while True:
            time.sleep(1)  # blocks the loop on purpose: the process is only waiting to be SIGKILLed
    done = await rollouts(engine, 6)
    if mode == "rank":
        import torch
        import torch.distributed as dist

        rank, world = (int(x) for x in args[0].split("/"))
        dist.init_process_group("gloo", init_method=f"file://{args[1]}", rank=rank, world_size=world)
        total = torch.tensor([done])
        dist.all_reduce(total)
        done = int(total.item())
        dist.destroy_process_group()
    await engine.aclose()
    print("DONE", done, flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]))
