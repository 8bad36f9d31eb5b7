"""Chaos: a thousand rollouts with random tool exceptions, tool timeouts, broken instances, acquire timeouts
and cancellations, through the real ``Tool.invoke`` and ``RolloutContext``; afterwards nothing is leaked.

The resources are in-process Scratchpads, so the whole run takes a few seconds; the same chaos against real
sandbox processes is in tests/integration/resources/test_sandbox_chaos.py.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from agentfly.context import RolloutContext
from agentfly.resources import InfrastructureFailure, Pool, ResourceEngine, ResourceSpec
from agentfly.resources.scratchpad import Scratchpad
from agentfly.tools import tool

ROLLOUTS = 1000
ACTIONS = ["ok", "ok", "ok", "raise", "sleep", "break", "unhealthy", "shared"]


async def test_a_thousand_chaotic_rollouts_leave_every_pool_empty_and_every_instance_accounted_for() -> None:
    rng = random.Random(1234)
    made: list[Scratchpad] = []
    violations: list[str] = []

    def factory(spec: ResourceSpec) -> Scratchpad:
        pad = Scratchpad(spec)
        made.append(pad)
        return pad

    @tool(resource="pad", timeout=0.02)
    async def step(action: str, context: Any) -> str:
        """One chaotic tool call."""
        pad = await context.resource("pad")
        owner = pad.read("owner")
        if owner not in (None, context.rollout_id):
            violations.append(f"{context.rollout_id} got pad {pad.serial} still holding {owner}'s notes")
        pad.write("owner", context.rollout_id)
        if action == "raise":
            raise RuntimeError("the tool failed")
        if action == "sleep":
            await asyncio.sleep(1)  # past the tool timeout: cancelled inside Tool.invoke
        if action == "break":
            pad.broken = True  # its reset will fail, so the pool must destroy it
        if action == "shared":
            index = await context.resource("index")
            index.write(context.rollout_id, "seen")
        return "ok"

    specs = [
        ResourceSpec(name="pad", factory=factory, backend="inprocess", pool=Pool(min=2, max=8),
                     acquire_timeout=0.05, health_interval=0.01),
        ResourceSpec(name="index", factory=factory, backend="inprocess", scope="global", pool=Pool(1, 1)),
    ]
    engine = ResourceEngine(specs)
    await engine.start()
    limit = asyncio.Semaphore(64)
    outcomes = {"done": 0, "cancelled": 0, "infra_failed": 0}
    timed_out: set[int] = set()

    async def rollout(i: int) -> str | None:
        ctx = RolloutContext(sample={"i": i}, rollout_id=f"r{i}", group_id=f"g{i // 4}", resources=engine)
        async with limit:
            try:
                for _ in range(rng.randint(1, 4)):
                    action = rng.choice(ACTIONS)
                    await step.invoke({"action": action}, context=ctx)
                    if action == "unhealthy":
                        ctx.mark_unhealthy("pad")
                    await asyncio.sleep(rng.random() * 0.002)
            except InfrastructureFailure:  # an acquire timeout ends the rollout, as the rollout loop does
                timed_out.add(i)  # here: a cancel may still land in the release below and end the task
                return "infra_failed"
            finally:
                await asyncio.shield(ctx.aclose())

    peaks = {"size": 0, "live": 0}
    stop = asyncio.Event()

    async def watch() -> None:  # the bound must hold at every moment, not only at the end
        while not stop.is_set():
            peaks["size"] = max(peaks["size"], engine.stats()["pad"]["size"])
            peaks["live"] = max(peaks["live"], sum(1 for p in made if not p.closed) - 1)  # minus the index
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    tasks = [asyncio.create_task(rollout(i)) for i in range(ROLLOUTS)]
    for task in rng.sample(tasks, 150):  # cancel some while they wait, act, or release
        asyncio.get_running_loop().call_later(rng.random() * 0.5, task.cancel)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for r in results:
        if isinstance(r, asyncio.CancelledError):
            outcomes["cancelled"] += 1
        elif r is None:
            outcomes["done"] += 1
        elif r == "infra_failed":
            outcomes["infra_failed"] += 1
        else:
            raise r
    await engine.settle()
    stop.set()
    await watcher

    stats = engine.stats()
    pad = stats["pad"]
    assert violations == []
    assert sum(outcomes.values()) == ROLLOUTS and outcomes["cancelled"] > 0
    assert len(timed_out) == pad["timeouts"] > 0  # each acquire timeout ended its rollout, typed
    assert outcomes["infra_failed"] <= len(timed_out)  # the rest were cancelled while they released
    assert pad["in_use"] == 0 and pad["waiting"] == 0 and pad["resetting"] == 0 and pad["creating"] == 0
    assert 2 <= pad["size"] <= 8
    assert peaks["size"] <= 8
    assert peaks["live"] <= 8  # counting instances being destroyed: a replacement never starts early
    assert pad["timeouts"] > 0 and pad["failed"] > 0  # the chaos did happen
    assert stats["index"]["in_use"] == 0 and stats["index"]["size"] == 1
    live = [p for p in made if not p.closed]
    assert len(live) == pad["size"] + stats["index"]["size"]
    assert pad["created"] - pad["destroyed"] == pad["size"]

    await engine.aclose()
    assert all(p.closed for p in made)
