"""Tool-call overhead of an MCP server against the in-process store, measured in the same run.

The key-chain ``lookup`` tool called through ``Tool.invoke`` with a rollout context, as the rollout loop calls
it: once with the in-process ``KeyChainStore`` (``agentfly.tools.builtin.lookup``), once with the store served
by the stdio MCP server in the sandbox (``agentfly.tools.builtin.mcp_lookup``), and once over streamable HTTP
on loopback (``af.mcp.server(url=...)``'s ``get`` tool). Each rollout walks one chain of 4 links and answers;
the session (or store) is acquired before timing, so the numbers are per call, not per server start. Prints
p50 and p99 per call for each, and the ratio MCP / in-process.

    python benchmarks/mcp_overhead.py                # 400 calls each (about a minute on 2 cores)
    python benchmarks/mcp_overhead.py --calls 40     # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import itertools
import socket
import subprocess
import sys
import time
from typing import Any

import agentfly as af
from agentfly.context import RolloutContext

# By module: the package exports the tools under the same names.
inproc = importlib.import_module("agentfly.tools.builtin.lookup")
mcp_lookup = importlib.import_module("agentfly.tools.builtin.mcp_lookup")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def sample(i: int) -> dict[str, Any]:
    keys = [f"k{i}_{j}" for j in range(5)]
    return {"id": str(i), "start": keys[0], "links": dict(itertools.pairwise(keys)), "answer": "421"}


async def walk(engine: af.ResourceEngine, tool: af.Tool, resource: str, calls: int) -> list[float]:
    """Per-call seconds of ``tool`` over rollouts of 5 lookups (a chain of 4 links, then the final value)."""
    times: list[float] = []
    i = 0
    while len(times) < calls:
        s = sample(i)
        ctx = RolloutContext(sample=s, rollout_id=f"r{i}", group_id="g", resources=engine)
        try:
            await ctx.resource(resource)  # acquired before timing: the call, not the pool, is measured
            key = s["start"]
            for _ in range(5):
                start = time.perf_counter()
                result = await tool.invoke({"key": key}, ctx)
                times.append(time.perf_counter() - start)
                assert result.ok, result.observation
                key = result.observation.split(": ", 1)[1]
        finally:
            await ctx.aclose()
        i += 1
    return times


async def http_calls(url: str, calls: int) -> list[float]:
    spec = af.mcp.server("kv_http", url=url, pool=af.Pool(0, 1))
    tools = {t.name: t for t in await af.mcp.atools_from(spec)}
    times: list[float] = []
    async with af.ResourceEngine([spec]) as engine:
        ctx = RolloutContext(sample={}, rollout_id="http", group_id="g", resources=engine)
        try:
            await tools["put"].invoke({"key": "k", "value": "v"}, ctx)
            for _ in range(calls):
                start = time.perf_counter()
                result = await tools["get"].invoke({"key": "k"}, ctx)
                times.append(time.perf_counter() - start)
                assert result.ok, result.observation
        finally:
            await ctx.aclose()
    return times


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def main(calls: int) -> None:
    async with af.ResourceEngine([inproc.KEY_CHAIN]) as engine:
        await walk(engine, inproc.lookup, inproc.RESOURCE, 20)  # warm-up
        base = await walk(engine, inproc.lookup, inproc.RESOURCE, calls)
    spec = mcp_lookup.KEY_CHAIN_MCP.replace(pool=af.Pool(0, 1))
    async with af.ResourceEngine([spec]) as engine:
        await walk(engine, mcp_lookup.lookup, mcp_lookup.RESOURCE, 20)
        stdio = await walk(engine, mcp_lookup.lookup, mcp_lookup.RESOURCE, calls)
    port = free_port()
    server = subprocess.Popen([sys.executable, str(mcp_lookup.STORE), "--http", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                await asyncio.sleep(0.1)
        await http_calls(f"http://127.0.0.1:{port}/mcp", 20)
        http = await http_calls(f"http://127.0.0.1:{port}/mcp", calls)
    finally:
        server.kill()
        server.wait()

    def row(name: str, times: list[float]) -> None:
        p50, p99 = pct(times, 50) * 1e3, pct(times, 99) * 1e3
        print(f"{name:<24} p50 {p50:8.3f} ms   p99 {p99:8.3f} ms   "
              f"({p50 / (pct(base, 50) * 1e3):.1f}x / {p99 / (pct(base, 99) * 1e3):.1f}x in-process)")

    print(f"tool-call overhead, {calls} calls each (Tool.invoke with a rollout context)")
    row("in-process store", base)
    row("MCP stdio (sandboxed)", stdio)
    row("MCP streamable HTTP", http)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    asyncio.run(main(parser.parse_args().calls))
