"""The ``ray`` backend against the ``local`` one, on a real multi-node Ray cluster made on this machine.

(a) Warm acquire and release latency (p50, p99) and one tool call's round trip (``PythonSandbox.run``), ray
    against local, the same pool (pre-warmed sandboxes) and workload, one acquirer at a time. Target: a
    warm acquire adds at most 2 ms at p50.
(b) Environment-bound rollouts per second on 1, 2 and 3 nodes, 4 slots per node (a custom resource): each
    rollout holds its instance for a fixed 200 ms. Target: N nodes reach at least 0.9 x N times one node.
(c) The chaos run: 1,000 chaotic rollouts across 3 nodes, one removed during the run (the slow test
    ``test_a_thousand_chaotic_rollouts_across_three_nodes...``), and its counts.

    python benchmarks/resources_cluster.py               # all three (several minutes; wants idle cores)
    python benchmarks/resources_cluster.py --only a b    # skip the chaos run
    python benchmarks/resources_cluster.py --quick       # small sizes, a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agentfly.resources import Pool, PythonSandbox, ResourceEngine, ResourceSpec
from agentfly.resources.backends.ray import RaySettings, on_ray

ROOT = Path(__file__).resolve().parents[1]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


class Station:
    """An environment whose every step takes a fixed time: rollouts are bound by the environment alone."""

    kind = "environment"

    async def start(self) -> None: ...
    async def reset(self) -> None: ...
    async def health(self) -> bool:
        return True

    async def close(self) -> None: ...
    def kill(self) -> None: ...

    async def step(self, seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "ok"


# ------------------------------------------------------------------------------------------------ (a)
async def latency(engine: ResourceEngine, n: int) -> dict[str, float]:
    await engine.start()
    acquire, release, call = [], [], []
    for _ in range(5):  # warm every instance and the paths
        lease = await engine.acquire("python")
        await lease.instance.run("1")
        await engine.release(lease)
        await asyncio.sleep(0.05)
    for _ in range(n):
        t0 = time.perf_counter()
        lease = await engine.acquire("python")
        t1 = time.perf_counter()
        await lease.instance.run("x = 1")
        t2 = time.perf_counter()
        await engine.release(lease)
        t3 = time.perf_counter()
        acquire.append(t1 - t0)
        call.append(t2 - t1)
        release.append(t3 - t2)
        await asyncio.sleep(0.02)  # the background reset finishes: every acquire is a warm one
    await engine.aclose()
    ms = 1000
    return {"acquire_p50": pct(acquire, 50) * ms, "acquire_p99": pct(acquire, 99) * ms,
            "release_p50": pct(release, 50) * ms, "release_p99": pct(release, 99) * ms,
            "call_p50": pct(call, 50) * ms, "call_p99": pct(call, 99) * ms}


def bench_latency(n: int) -> None:
    spec = ResourceSpec(name="python", factory=PythonSandbox, pool=Pool(4, 4), health_interval=0)
    local = asyncio.run(latency(ResourceEngine([spec]), n))
    ray_ = asyncio.run(latency(ResourceEngine([on_ray(spec)], ray=RaySettings(job="bench-latency")), n))
    print(f"(a) warm acquire/release and a tool call, {n} each, one at a time (ms):")
    for key in local:
        print(f"    {key:12s} local {local[key]:7.3f}   ray {ray_[key]:7.3f}   +{ray_[key] - local[key]:.3f}")
    added = ray_["acquire_p50"] - local["acquire_p50"]
    print(f"    warm acquire adds {added:.3f} ms at p50 (target <= 2 ms): {'met' if added <= 2 else 'NOT met'}")


# ------------------------------------------------------------------------------------------------ (b)
async def rollouts_per_second(job: str, nodes: int, rollouts: int, hold: float, slots: int) -> float:
    spec = ResourceSpec(name="station", factory=Station, backend="inprocess", pool=Pool(0, slots * nodes),
                        acquire_timeout=600, health_interval=0, options={"ray": {"resources": {"slot": 1}}})
    engine = ResourceEngine([on_ray(spec)], ray=RaySettings(job=job))
    await engine.start()

    async def rollout() -> None:
        lease = await engine.acquire("station")
        try:
            await lease.instance.step(hold)
        finally:
            await engine.release(lease)

    # Every slot started once first: the rate below is the steady state, not actor start-up.
    await asyncio.gather(*(rollout() for _ in range(slots * nodes)))
    start = time.perf_counter()
    await asyncio.gather(*(rollout() for _ in range(rollouts)))
    rate = rollouts / (time.perf_counter() - start)
    await engine.aclose()
    return rate


def bench_scaling(rollouts_per_node: int, hold: float, slots: int, cluster: Any) -> None:
    rates = []
    for n in (1, 2, 3):
        if n > 1:
            cluster.add_node(num_cpus=1, resources={"slot": slots})
            cluster.wait_for_nodes()
        rates.append(asyncio.run(rollouts_per_second(f"bench-scale-{n}", n, rollouts_per_node * n, hold, slots)))
    print(f"(b) environment-bound rollouts/s ({hold * 1000:g} ms hold, {slots} slots per node):")
    for n, rate in zip((1, 2, 3), rates, strict=True):
        ratio = rate / rates[0]
        print(f"    {n} node(s): {rate:7.2f}/s   {ratio:.2f}x one node (target >= {0.9 * n:.1f}x): "
              f"{'met' if ratio >= 0.9 * n else 'NOT met'}")


# ------------------------------------------------------------------------------------------------ (c)
def bench_chaos(rollouts: int) -> None:
    env = {**os.environ, "AGENTFLY_CHAOS_ROLLOUTS": str(rollouts), "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-k", "thousand",
         "tests/integration/resources/test_ray_backend.py"], cwd=ROOT, env=env, capture_output=True, text=True)
    counts = re.findall(r"^chaos .*$", result.stdout, re.M)
    print(f"(c) chaos, {rollouts} rollouts across 3 nodes, one removed: "
          f"{'passed' if result.returncode == 0 else 'FAILED'}")
    print("    " + (counts[0] if counts else result.stdout[-2000:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", choices=["a", "b", "c"], default=["a", "b", "c"])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    args = parser.parse_args()
    import ray
    from ray.cluster_utils import Cluster

    if "c" in args.only and args.only == ["c"]:
        bench_chaos(60 if args.quick else 1000)
        return
    slots = 4
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1, resources={"slot": slots})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    try:
        if "a" in args.only:
            bench_latency(50 if args.quick else 500)
        if "b" in args.only:
            bench_scaling(8 if args.quick else 120, 0.2, slots, cluster)
    finally:
        ray.shutdown()
        cluster.shutdown()
    if "c" in args.only:
        bench_chaos(60 if args.quick else 1000)


if __name__ == "__main__":
    main()
