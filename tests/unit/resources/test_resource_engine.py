"""ResourceEngine and its pools, driven with the in-process Scratchpad resource (no processes, fast)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from agentfly.context import RolloutContext
from agentfly.resources import (
    InfrastructureFailure,
    Pool,
    ResourceClosed,
    ResourceEngine,
    ResourceError,
    ResourceSpec,
    ResourceTimeout,
    UnknownResource,
)
from agentfly.resources.scratchpad import Scratchpad
from agentfly.tools import tool


def pad_spec(name: str = "pad", **kw: Any) -> ResourceSpec:
    kw.setdefault("pool", Pool(min=0, max=2))
    kw.setdefault("acquire_timeout", 5)
    return ResourceSpec(name=name, factory=Scratchpad, kind="other", backend="inprocess", **kw)


class Flaky(Scratchpad):
    """A scratchpad whose start fails on demand: a factory that sometimes cannot build an instance."""

    fail_next = 0

    async def start(self) -> None:
        if Flaky.fail_next:
            Flaky.fail_next -= 1
            raise OSError("no capacity")
        await super().start()


async def test_a_rollout_gets_the_same_instance_on_every_turn_and_releases_it_at_the_end() -> None:
    async with ResourceEngine([pad_spec()]) as engine:
        ctx = RolloutContext(sample={}, rollout_id="r1", group_id="g", resources=engine)
        first = await ctx.resource("pad")
        first.write("k", "v")
        assert await ctx.resource("pad") is first
        assert engine.stats()["pad"]["in_use"] == 1
        await ctx.aclose()
        await engine.settle()
        stats = engine.stats()["pad"]
        assert (stats["in_use"], stats["idle"], stats["size"]) == (0, 1, 1)


async def test_a_released_instance_is_reset_before_the_next_rollout_sees_it() -> None:
    async with ResourceEngine([pad_spec(pool=Pool(0, 1))]) as engine:
        lease = await engine.acquire("pad", owner="a")
        lease.instance.write("secret", "42")
        await engine.release(lease)
        again = await engine.acquire("pad", owner="b")
        assert again.instance is lease.instance
        assert again.instance.read("secret") is None
        assert again.instance.resets == 1
        await engine.release(again)


class SlowStart(Scratchpad):
    """A scratchpad that takes a moment to start (a server process importing its SDK) and counts how many
    are starting at once."""

    starting = 0
    peak = 0

    async def start(self) -> None:
        SlowStart.starting += 1
        SlowStart.peak = max(SlowStart.peak, SlowStart.starting)
        try:
            await asyncio.sleep(0.02)
        finally:
            SlowStart.starting -= 1
        await super().start()


@pytest.mark.parametrize("starting", [None, 3])
async def test_a_pool_starts_at_most_starting_instances_at_once_and_every_acquirer_still_gets_one(
        starting: int | None) -> None:
    SlowStart.starting = SlowStart.peak = 0
    spec = ResourceSpec(name="srv", factory=SlowStart, kind="other", backend="inprocess",
                        pool=Pool(min=0, max=12, starting=starting), acquire_timeout=10)
    async with ResourceEngine([spec]) as engine:
        leases = await asyncio.gather(*(engine.acquire("srv", owner=f"r{i}") for i in range(12)))
        assert len({id(lease.instance) for lease in leases}) == 12
        for lease in leases:
            await engine.release(lease)
    assert SlowStart.peak == (12 if starting is None else 3)


def test_a_pool_that_starts_no_instance_at_a_time_is_refused() -> None:
    with pytest.raises(ValueError, match=r"starting=0.*at least 1"):
        Pool(max=4, starting=0)


async def test_concurrent_acquires_never_push_the_pool_past_max() -> None:
    async with ResourceEngine([pad_spec(pool=Pool(0, 3))]) as engine:
        peak = 0

        async def rollout(i: int) -> None:
            nonlocal peak
            lease = await engine.acquire("pad", owner=str(i))
            peak = max(peak, engine.stats()["pad"]["size"])
            await asyncio.sleep(0.001 * (i % 3))
            await engine.release(lease)

        await asyncio.gather(*(rollout(i) for i in range(50)))
        await engine.settle()
        stats = engine.stats()["pad"]
        # 50 at once fill the pool to its max, never past it, and reuse those three.
        assert peak == 3
        assert stats["created"] == 3
        assert stats["in_use"] == 0 and stats["waiting"] == 0


async def test_waiters_are_served_first_in_first_out() -> None:
    async with ResourceEngine([pad_spec(pool=Pool(0, 1))]) as engine:
        held = await engine.acquire("pad", owner="holder")
        order: list[int] = []

        async def waiter(i: int) -> None:
            lease = await engine.acquire("pad", owner=str(i))
            order.append(i)
            await asyncio.sleep(0)
            await engine.release(lease)

        tasks = []
        for i in range(5):
            tasks.append(asyncio.create_task(waiter(i)))
            await asyncio.sleep(0)  # enqueue in a known order
        assert engine.stats()["pad"]["waiting"] == 5
        await engine.release(held)
        await asyncio.gather(*tasks)
        assert order == [0, 1, 2, 3, 4]


async def test_an_acquire_on_a_full_pool_times_out_with_an_error_naming_the_pool() -> None:
    async with ResourceEngine([pad_spec(pool=Pool(0, 1), acquire_timeout=0.05)]) as engine:
        held = await engine.acquire("pad")
        with pytest.raises(ResourceTimeout, match=r"no 'pad' instance became free within 0.05 s.*max of 1"):
            await engine.acquire("pad")
        stats = engine.stats()["pad"]
        assert stats["timeouts"] == 1 and stats["waiting"] == 0
        await engine.release(held)


async def test_a_timed_out_acquire_is_an_infrastructure_failure_never_an_observation_for_the_model() -> None:
    # The agent did not cause the wait: reading "Error: ..." and scoring 0 would train it on the pool's fault.
    @tool(resource="pad")
    async def note(text: str, context: Any) -> str:
        """Write a note."""
        pad = await context.resource("pad")
        pad.write("n", text)
        return "ok"

    async with ResourceEngine([pad_spec(pool=Pool(0, 1), acquire_timeout=0.05)]) as engine:
        holder = RolloutContext(sample={}, rollout_id="holder", group_id="g", resources=engine)
        assert (await note.invoke({"text": "a"}, context=holder)).observation == "ok"
        starved = RolloutContext(sample={}, rollout_id="starved", group_id="g", resources=engine)
        with pytest.raises(ResourceTimeout, match="no 'pad' instance") as failure:
            await note.invoke({"text": "b"}, context=starved)
        assert isinstance(failure.value, InfrastructureFailure) and failure.value.kind == "acquire_timeout"
        await holder.aclose()
        await starved.aclose()


async def test_min_instances_are_prewarmed_when_the_engine_starts() -> None:
    engine = ResourceEngine([pad_spec(pool=Pool(min=2, max=4))])
    assert engine.stats()["pad"]["size"] == 0
    await engine.start()
    stats = engine.stats()["pad"]
    assert (stats["size"], stats["idle"], stats["created"]) == (2, 2, 2)
    await engine.aclose()


async def test_an_unhealthy_release_destroys_the_instance_and_the_next_acquire_gets_a_new_one() -> None:
    async with ResourceEngine([pad_spec(pool=Pool(0, 1))]) as engine:
        ctx = RolloutContext(sample={}, rollout_id="r", group_id="g", resources=engine)
        old = await ctx.resource("pad")
        ctx.mark_unhealthy("pad")
        await ctx.aclose()
        await engine.settle()
        assert old.closed
        lease = await engine.acquire("pad")
        assert lease.instance is not old
        stats = engine.stats()["pad"]
        assert (stats["created"], stats["destroyed"], stats["size"]) == (2, 1, 1)
        await engine.release(lease)


async def test_a_failing_reset_destroys_the_instance_instead_of_recycling_it() -> None:
    async with ResourceEngine([pad_spec(pool=Pool(0, 1))]) as engine:
        lease = await engine.acquire("pad")
        lease.instance.broken = True
        await engine.release(lease)
        await engine.settle()
        stats = engine.stats()["pad"]
        assert lease.instance.closed
        assert (stats["size"], stats["failed"], stats["destroyed"]) == (0, 1, 1)
        assert "reset failed" in stats["last_error"]


async def test_a_dead_idle_instance_is_replaced_when_it_is_handed_out() -> None:
    async with ResourceEngine([pad_spec(pool=Pool(min=1, max=1), health_interval=0)]) as engine:
        dead = engine.pools["pad"].idle[0].resource
        dead.broken = True
        lease = await engine.acquire("pad")
        assert lease.instance is not dead and dead.closed
        assert engine.stats()["pad"]["failed"] == 1
        await engine.release(lease)


async def test_the_health_monitor_replaces_dead_idle_instances_and_keeps_min() -> None:
    async with ResourceEngine([pad_spec(pool=Pool(min=2, max=2), health_interval=0.02)]) as engine:
        victim = engine.pools["pad"].idle[0].resource
        victim.broken = True
        for _ in range(100):
            await asyncio.sleep(0.02)
            if victim.closed and engine.stats()["pad"]["idle"] == 2:
                break
        assert victim.closed
        assert engine.stats()["pad"]["idle"] == 2
        assert all(not slot.resource.broken for slot in engine.pools["pad"].idle)


async def test_global_scope_shares_one_instance_and_release_only_drops_a_reference() -> None:
    async with ResourceEngine([pad_spec("index", scope="global", pool=Pool(1, 1))]) as engine:
        a = await engine.acquire("index", owner="a")
        b = await engine.acquire("index", owner="b")
        assert a.instance is b.instance
        a.instance.write("shared", "yes")
        assert engine.stats()["index"]["in_use"] == 2
        await engine.release(a)
        await engine.release(b)
        assert engine.stats()["index"]["in_use"] == 0
        c = await engine.acquire("index")
        assert c.instance is a.instance and c.instance.read("shared") == "yes"  # never reset
        await engine.release(c)


async def test_an_unhealthy_global_instance_is_replaced_once_its_last_holder_lets_go() -> None:
    async with ResourceEngine([pad_spec("index", scope="global")]) as engine:
        a = await engine.acquire("index")
        b = await engine.acquire("index")
        await engine.release(a, healthy=False)
        c = await engine.acquire("index")
        assert c.instance is not a.instance
        assert not a.instance.closed  # b still uses it
        await engine.release(b)
        await engine.settle()
        assert a.instance.closed
        await engine.release(c)


async def test_a_waiter_cancelled_while_waiting_does_not_take_an_instance_with_it() -> None:
    async with ResourceEngine([pad_spec(pool=Pool(0, 1))]) as engine:
        held = await engine.acquire("pad")
        waiter = asyncio.create_task(engine.acquire("pad"))
        await asyncio.sleep(0.01)
        waiter.cancel()
        await engine.release(held)
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await engine.settle()
        stats = engine.stats()["pad"]
        assert (stats["in_use"], stats["idle"], stats["waiting"]) == (0, 1, 0)
        lease = await engine.acquire("pad", timeout=0.1)
        await engine.release(lease)


async def test_a_failing_factory_counts_as_failed_and_frees_its_slot() -> None:
    spec = ResourceSpec(name="flaky", factory=Flaky, backend="inprocess", pool=Pool(0, 1), acquire_timeout=1)
    async with ResourceEngine([spec]) as engine:
        Flaky.fail_next = 1
        with pytest.raises(ResourceError, match="could not start resource 'flaky': OSError: no capacity"):
            await engine.acquire("flaky")
        lease = await engine.acquire("flaky")
        stats = engine.stats()["flaky"]
        assert (stats["failed"], stats["created"], stats["size"]) == (1, 1, 1)
        await engine.release(lease)


async def test_closing_the_engine_fails_waiters_and_closes_instances_still_in_use() -> None:
    engine = ResourceEngine([pad_spec(pool=Pool(0, 1))])
    await engine.start()
    held = await engine.acquire("pad")
    waiter = asyncio.create_task(engine.acquire("pad"))
    await asyncio.sleep(0.01)
    await engine.aclose()
    with pytest.raises(ResourceClosed):
        await waiter
    assert held.instance.closed
    with pytest.raises(ResourceClosed):
        await engine.acquire("pad")
    await engine.release(held)  # after close: a harmless no-op


async def test_an_unknown_resource_name_is_an_error_listing_the_known_ones() -> None:
    async with ResourceEngine([pad_spec()]) as engine:
        with pytest.raises(UnknownResource, match=r"no resource named 'python'; this engine has \['pad'\]"):
            await engine.acquire("python")


async def test_stats_report_acquire_latency_percentiles() -> None:
    hold = 0.2
    async with ResourceEngine([pad_spec(pool=Pool(1, 1))]) as engine:
        fast_ms = []  # 19 acquires of the idle instance, each timed around the call (an upper bound)
        for _ in range(19):
            start = time.perf_counter()
            lease = await engine.acquire("pad")
            fast_ms.append(1000 * (time.perf_counter() - start))
            if len(fast_ms) < 19:
                await engine.release(lease)
                await engine.settle()
        # The 20th waits while the 19th keeps the only instance for `hold` seconds.
        held = lease
        start = time.perf_counter()
        waiter = asyncio.create_task(engine.acquire("pad"))
        await asyncio.sleep(hold)
        await engine.release(held)
        await engine.release(await waiter)
        slow_ms = 1000 * (time.perf_counter() - start)
        stats = engine.stats()["pad"]
        assert stats["acquires"] == 20
        # The median is one of the quick acquires; the 99th percentile of 20 is the slowest, the wait.
        assert 0 < stats["acquire_p50_ms"] <= max(fast_ms)
        assert 1000 * hold / 2 <= stats["acquire_p99_ms"] <= slow_ms
        assert stats["acquire_p50_ms"] <= stats["acquire_p99_ms"]
        for key in ("size", "in_use", "idle", "waiting", "created", "destroyed", "failed"):
            assert key in stats


def test_bad_specs_are_rejected_with_the_fix_in_the_message() -> None:
    with pytest.raises(ValueError, match=r"need 0 <= min <= max"):
        Pool(min=3, max=2)
    with pytest.raises(ValueError, match=r"scope='job'; use one of"):
        ResourceSpec(name="x", factory=Scratchpad, scope="job")
    with pytest.raises(TypeError, match="factory must be callable"):
        ResourceSpec(name="x", factory="Scratchpad")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="two resources are named 'pad'"):
        ResourceEngine([pad_spec(), pad_spec()])
    with pytest.raises(TypeError, match="lacks start, reset, health, close"):
        ResourceSpec(name="x", factory=dict).build()


async def test_a_resource_can_be_held_with_async_with_and_stays_held_until_the_rollout_ends() -> None:
    async with ResourceEngine([pad_spec()]) as engine:
        ctx = RolloutContext(sample={}, rollout_id="r", group_id="g", resources=engine)
        async with ctx.resource("pad") as pad:
            pad.write("k", "v")
        assert engine.stats()["pad"]["in_use"] == 1
        assert (await ctx.resource("pad")).read("k") == "v"
        await ctx.aclose()
        assert engine.stats()["pad"]["in_use"] == 0


def test_one_engine_serves_consecutive_event_loops_with_fresh_pools_for_each() -> None:
    engine = ResourceEngine([pad_spec(pool=Pool(1, 2))])

    async def rollout() -> Scratchpad:
        lease = await engine.acquire("pad")
        await engine.release(lease)
        return lease.instance

    first = asyncio.run(rollout())
    second = asyncio.run(rollout())  # the first loop is gone: its instances are killed, fresh ones made
    assert first.closed and not second.closed
    engine.close()
    assert second.closed and engine.closed


async def test_an_engine_that_cannot_start_stops_what_it_already_started() -> None:
    made: list[Scratchpad] = []

    def good(spec: ResourceSpec) -> Scratchpad:
        made.append(Scratchpad(spec))
        return made[-1]

    Flaky.fail_next = 5
    specs = [ResourceSpec(name="good", factory=good, pool=Pool(2, 2)),
             ResourceSpec(name="flaky", factory=Flaky, pool=Pool(1, 1))]
    with pytest.raises(ResourceError, match="could not start resource 'flaky'"):
        async with ResourceEngine(specs):
            pass
    Flaky.fail_next = 0
    assert len(made) == 2 and all(p.closed for p in made)


async def test_the_stats_report_the_most_held_at_once_since_the_previous_stats_as_the_step_peak() -> None:
    async with ResourceEngine([pad_spec(pool=Pool(0, 4))]) as engine:
        engine.stats()
        leases = [await engine.acquire("pad", owner=f"r{i}") for i in range(3)]
        await engine.release(leases.pop())
        for lease in leases:
            await engine.release(lease)
        await engine.settle()
        stats = engine.stats()["pad"]  # between steps: nothing held now, three at once during the step
        assert (stats["in_use"], stats["peak_in_use"]) == (0, 3)
        assert engine.stats()["pad"]["peak_in_use"] == 0  # the next step starts from what is held now
