"""Benchmarks of the resource layer; each prints its number next to a baseline measured in the same run.

(a) ScienceWorld: rollouts of 5 actions that hold one pooled, pre-warmed JVM for the whole rollout, versus
    starting a simulator for every tool call (the naive way: start, load the task, act, stop).
(b) Acquire/release latency p50/p99 from a warm pool of sandboxes under 64 concurrent waiters, versus
    starting a fresh sandbox for each acquire.
(c) 64 concurrent rollouts (3 Python calls each) against a pool of 8 sandboxes, versus a pool of 64:
    throughput, and the peak memory of all sandbox processes, sampled while it runs; backpressure keeps it
    flat at 8 sandboxes' worth.
(d) Training steps: consecutive ``Agent.run_sync`` calls (one per step, as the trainer makes them) of
    ScienceWorld rollouts, scripted (``ReplayEngine``) to act in their simulator, with a pool of 2. The
    agent keeps one event loop across calls, so the simulators started at the first step serve every later
    one; the baseline is a fresh event loop per step (``asyncio.run``, as ``run_sync`` did before), whose
    pools start over. Seconds per step and simulators started, after a first step that both pay.

    python benchmarks/resources.py                 # all four (about three minutes on 2 cores)
    python benchmarks/resources.py --only b c      # skip the JVMs
    python benchmarks/resources.py --quick         # small sizes, a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from typing import Any

import psutil

from agentfly.resources import Pool, PythonSandbox, ResourceEngine, ResourceSpec


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def children_rss_mb() -> float:
    total = 0
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += child.memory_info().rss
    return total / 2**20


# ------------------------------------------------------------------------------------------------ (a)
async def bench_scienceworld(rollouts: int, turns: int = 5) -> None:
    from agentfly.envs import SCIENCEWORLD, ScienceWorld
    from agentfly.envs.scienceworld import java_available

    if java_available():
        print(f"(a) skipped: {java_available()}")
        return
    actions = ["look around", "teleport to kitchen", "look around", "teleport to outside", "look around"][:turns]
    task, variation = "find-living-thing", 0

    # Baseline: a simulator per tool call (start, load, act, close).
    start = time.perf_counter()
    for _ in range(rollouts):
        for action in actions:
            env = ScienceWorld()
            await env.start()
            await env.load(task, variation)
            await env.act(action)
            await env.close()
    per_call = (time.perf_counter() - start) / rollouts

    # Pooled: warmed before the clock starts, one acquire per rollout, load once, five actions.
    spec = SCIENCEWORLD.replace(pool=Pool(min=1, max=1))
    async with ResourceEngine([spec]) as engine:
        start = time.perf_counter()
        for r in range(rollouts):
            lease = await engine.acquire("scienceworld", owner=f"r{r}")
            await lease.instance.load(task, variation)
            for action in actions:
                await lease.instance.act(action)
            await engine.release(lease)
            await engine.settle()
        pooled = (time.perf_counter() - start) / rollouts
    print(f"(a) ScienceWorld rollout of {turns} actions: pooled+reused {pooled:.2f} s, "
          f"instance per tool call {per_call:.2f} s  -> {per_call / pooled:.1f}x faster with the pool")


# ------------------------------------------------------------------------------------------------ (b)
async def acquire_release(waiters: int, rounds: int, pool_size: int, pause: float = 0.0,
                          ) -> tuple[list[float], list[float], int]:
    spec = ResourceSpec(name="python", factory=PythonSandbox, pool=Pool(min=pool_size, max=pool_size),
                        acquire_timeout=120, health_interval=0)
    async with ResourceEngine([spec]) as engine:
        acquire: list[float] = []
        release: list[float] = []

        async def worker(i: int) -> None:
            for _ in range(rounds):
                t0 = time.perf_counter()
                lease = await engine.acquire("python", owner=str(i))
                acquire.append(time.perf_counter() - t0)
                await lease.instance.run("x = 1")
                t0 = time.perf_counter()
                await engine.release(lease)
                release.append(time.perf_counter() - t0)
                await asyncio.sleep(pause)  # > 0: let the background reset finish first

        await asyncio.gather(*(worker(i) for i in range(waiters)))
        await engine.settle()
        return acquire, release, engine.stats()["python"]["created"]


async def bench_latency(waiters: int, rounds: int, pool_size: int) -> None:
    acquire, release, created = await acquire_release(waiters, rounds, pool_size)
    print(f"(b) {waiters} concurrent waiters, warm pool of {pool_size} sandboxes, {len(acquire)} acquires "
          f"({created} sandboxes created in all): acquire p50 {pct(acquire, 50) * 1000:.1f} ms, "
          f"p99 {pct(acquire, 99) * 1000:.1f} ms (mostly queueing: {waiters // pool_size} waiters per sandbox); "
          f"release p50 {pct(release, 50) * 1000:.3f} ms, p99 {pct(release, 99) * 1000:.3f} ms "
          "(the reset runs in the background)")
    free, _, _ = await acquire_release(pool_size, rounds * 4, pool_size, pause=0.05)
    cold: list[float] = []
    for _ in range(10):
        t0 = time.perf_counter()
        box = PythonSandbox()
        await box.start()
        cold.append(time.perf_counter() - t0)
        await box.close()
    warm = statistics.median(free)
    print(f"    with a reset sandbox idle: acquire p50 {warm * 1000:.2f} ms, p99 {pct(free, 99) * 1000:.2f} ms; "
          f"baseline, a fresh sandbox per acquire: p50 {statistics.median(cold) * 1000:.1f} ms "
          f"-> {statistics.median(cold) / warm:.0f}x faster from the warm pool")


# ------------------------------------------------------------------------------------------------ (c)
async def run_rollouts(n: int, pool_max: int, calls: int) -> dict[str, Any]:
    spec = ResourceSpec(name="python", factory=PythonSandbox, pool=Pool(min=0, max=pool_max),
                        acquire_timeout=300, health_interval=0)
    peak = 0.0
    samples: list[float] = []
    done = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not done.is_set():
            rss = children_rss_mb()
            samples.append(rss)
            peak = max(peak, rss)
            await asyncio.sleep(0.05)

    async with ResourceEngine([spec]) as engine:
        sampler = asyncio.create_task(sample())

        async def rollout(i: int) -> None:
            lease = await engine.acquire("python", owner=str(i))
            try:
                for c in range(calls):
                    await lease.instance.run(f"data = list(range(200_000)); total = sum(data) + {c}")
            finally:
                await engine.release(lease)

        start = time.perf_counter()
        await asyncio.gather(*(rollout(i) for i in range(n)))
        elapsed = time.perf_counter() - start
        await engine.settle()
        done.set()
        await sampler
        stats = engine.stats()["python"]
    return {"elapsed": elapsed, "peak_mb": peak, "created": stats["created"], "p99_ms": stats["acquire_p99_ms"]}


async def bench_backpressure(n: int, pool_max: int, calls: int) -> None:
    bounded = await run_rollouts(n, pool_max, calls)
    unbounded = await run_rollouts(n, n, calls)
    print(f"(c) {n} concurrent rollouts x {calls} calls, pool of {pool_max}: {n / bounded['elapsed']:.1f} rollouts/s, "
          f"peak sandbox memory {bounded['peak_mb']:.0f} MB, {bounded['created']} sandboxes")
    print(f"    baseline pool of {n}: {n / unbounded['elapsed']:.1f} rollouts/s, peak sandbox memory "
          f"{unbounded['peak_mb']:.0f} MB, {unbounded['created']} sandboxes"
          f"  -> memory x{bounded['peak_mb'] / max(unbounded['peak_mb'], 1e-9):.2f}, "
          f"throughput x{unbounded['elapsed'] / bounded['elapsed']:.2f} with backpressure")


# ------------------------------------------------------------------------------------------------ (d)
def bench_steps(steps: int, rollouts: int) -> None:
    import agentfly as af
    from agentfly.envs import SCIENCEWORLD
    from agentfly.envs.scienceworld import java_available
    from agentfly.tools.builtin.scienceworld import sciworld_act

    if java_available():
        print(f"(d) skipped: {java_available()}")
        return
    import tempfile

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(af.models.build_tiny(tempfile.mkdtemp(prefix="agentfly-bench-")))

    def script(prompt: str) -> str:
        if prompt.count("<tool_response>") < 2:
            return '<tool_call>\n{"name": "sciworld_act", "arguments": {"action": "look around"}}\n</tool_call>'
        return "done"

    samples = [{"question": "Find a living thing.", "task": "find-living-thing", "variation": 0}] * rollouts

    def run(kept: bool) -> tuple[float, int]:
        """Seconds per step after the first, and simulators started in all."""
        engine = ResourceEngine([SCIENCEWORLD.replace(pool=Pool(min=0, max=2))])
        agent = af.Agent(af.ReplayEngine(tokenizer, script), tools=[sciworld_act], resources=engine, max_turns=3)
        created, times = 0, []
        for _ in range(steps):
            start = time.perf_counter()
            if kept:
                trajectories = agent.run_sync(samples)
            else:
                created += engine.stats()["scienceworld"]["created"]  # this step's pool replaces the last one's
                trajectories = asyncio.run(agent.run(samples))
            times.append(time.perf_counter() - start)
            bad = [t for t in trajectories if t.error or len(t.tool_calls) != 2 or t.tool_errors]
            assert not bad, (bad[0].error, [c.error for c in bad[0].tool_calls], bad[0].finish_reason)
        created += engine.stats()["scienceworld"]["created"]
        engine.close()
        agent.close()
        return statistics.mean(times[1:]), created

    fresh, fresh_made = run(kept=False)
    kept, kept_made = run(kept=True)
    print(f"(d) {steps} steps of {rollouts} ScienceWorld rollouts (2 actions each), pool of 2: simulators kept "
          f"across steps {kept:.2f} s a step ({kept_made} started); baseline, a fresh event loop per step "
          f"{fresh:.2f} s a step ({fresh_made} started)  -> {fresh / kept:.1f}x faster per step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", choices=["a", "b", "c", "d"], default=["a", "b", "c", "d"])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    args = parser.parse_args()
    waiters = 16 if args.quick else 64
    if "a" in args.only:
        asyncio.run(bench_scienceworld(rollouts=1 if args.quick else 2))
    if "b" in args.only:
        asyncio.run(bench_latency(waiters=waiters, rounds=2 if args.quick else 5, pool_size=8))
    if "c" in args.only:
        asyncio.run(bench_backpressure(n=waiters, pool_max=8, calls=2 if args.quick else 3))
    if "d" in args.only:
        bench_steps(steps=2 if args.quick else 4, rollouts=4)


if __name__ == "__main__":
    main()
