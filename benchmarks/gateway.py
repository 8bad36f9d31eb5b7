"""What the gateway costs per request against the in-process rollout loop, at 1, 16 and 128 concurrent clients.

The same engine (the tiny model's ``HFEngine``, greedy, ``--max-new-tokens`` per turn) answers one-turn
conversations two ways in the same run: through ``RolloutRunner.run_one`` in process (the rollout loop's own
path: render, generate, parse), and through the gateway over HTTP (``POST /v1/chat/completions`` with a
rollout's key, from ``C`` concurrent clients on loopback). For each ``C`` it prints requests per second and
latency p50/p99 of each path, the latency the gateway adds (p50 and p99, gateway minus in-process) and the
ratios. The clients are agents as teams run them: in a process of their own (here one, with ``C`` coroutines),
each with its own ``httpx.AsyncClient`` (as each agent makes its own ``OpenAI(...)``). On a 2-core machine
that process takes CPU from the server and the engine, which the in-process path never pays, so the ratio is
a lower bound on what the gateway itself keeps. (Clients in this process, sharing one connection pool, measure
mostly httpx: its pool scans every connection on each request, which at 128 connections took 5 of every 10
samples in a py-spy profile.)

    python benchmarks/gateway.py                                   # 1, 16, 128 clients x 8 requests each
    python benchmarks/gateway.py --clients 1 16 --requests 2       # a smoke run (well under a minute)
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def question(i: int) -> dict[str, Any]:
    return {"id": f"q{i}", "question": f"What is {i} + {i * 7 % 13}?", "answer": str(i + i * 7 % 13)}


async def in_process(runner: Any, sampling: Any, clients: int, requests: int) -> tuple[list[float], float]:
    """Per-request seconds of ``clients`` concurrent loops of ``requests`` one-turn rollouts, and the wall time."""
    times: list[float] = []

    async def client(c: int) -> None:
        for r in range(requests):
            start = time.perf_counter()
            traj = await runner.run_one(question(c * requests + r), sampling, index=c * requests + r)
            times.append(time.perf_counter() - start)
            assert traj.error is None, traj.error

    start = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    return times, time.perf_counter() - start


CLIENTS = """
import asyncio, json, logging, sys, time
import httpx

async def main(url, handouts, clients, requests):
    times = []

    async def client(c):
        async with httpx.AsyncClient(base_url=url, timeout=600) as http:  # one agent, its own connection
            for r in range(requests):
                rollout = handouts[c * requests + r]
                start = time.perf_counter()
                response = await http.post("/chat/completions", json={"model": "policy", "messages": rollout["messages"]},
                                           headers={"Authorization": "Bearer " + rollout["api_key"]})
                times.append(time.perf_counter() - start)
                response.raise_for_status()

    start = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    return times, time.perf_counter() - start

job = json.load(sys.stdin)
logging.getLogger("httpx").setLevel(logging.WARNING)
times, wall = asyncio.run(main(job["url"], job["handouts"], job["clients"], job["requests"]))
json.dump({"times": times, "wall": wall}, sys.stdout)
"""


def through_gateway(server: Any, sampling: Any, clients: int, requests: int) -> tuple[list[float], float]:
    """Per-request seconds of ``clients`` concurrent agents (in a process of their own) making ``requests``
    one-turn rollouts each, and the wall time."""
    import json
    import subprocess
    import sys

    gateway = server.gateway
    gateway.hand_out([question(i) for i in range(clients * requests)], 1, sampling)
    handouts = gateway.take(clients * requests)
    job = {"url": server.url, "handouts": handouts, "clients": clients, "requests": requests}
    done = subprocess.run([sys.executable, "-c", CLIENTS], input=json.dumps(job), capture_output=True, text=True,
                          check=True)
    result = json.loads(done.stdout)
    for rollout in handouts:
        gateway.set_reward(rollout["rollout_id"], 0.0)
    gateway.wait([h["rollout_id"] for h in handouts])
    return result["times"], result["wall"]


def main(levels: list[int], requests: int, max_new_tokens: int) -> None:
    from agentfly.engines import HFEngine, Sampling
    from agentfly.gateway import Gateway, GatewayLimits
    from agentfly.gateway.server import GatewayServer
    from agentfly.models import build_tiny
    from agentfly.rollout.loop import RolloutRunner
    from agentfly.rollout.parsers import get_parser

    torch.set_num_threads(1)
    model_dir = Path(tempfile.mkdtemp(prefix="gateway-bench-")) / "tiny"
    build_tiny(model_dir, seed=0)
    engine = HFEngine(model_dir)
    sampling = Sampling(temperature=0.0, max_new_tokens=max_new_tokens)
    runner = RolloutRunner(engine, tools={}, parser=get_parser("hermes"), max_turns=1)
    server = GatewayServer(Gateway(engine, limits=GatewayLimits(max_inflight=max(levels) * 2))).start()
    try:
        # One warm-up round each: the first calls pay for lazy imports and allocator growth.
        asyncio.run(in_process(runner, sampling, 2, 1))
        through_gateway(server, sampling, 2, 1)
        print(f"gateway overhead per request: one-turn chats, {max_new_tokens} greedy tokens, {requests} requests "
              "per client, tiny model (HFEngine)")
        print(f"{'clients':>7} {'path':<11} {'req/s':>8} {'p50 ms':>9} {'p99 ms':>9} {'added p50':>10} "
              f"{'added p99':>10} {'req/s ratio':>11}")
        for clients in levels:
            base, base_wall = asyncio.run(in_process(runner, sampling, clients, requests))
            gw, gw_wall = through_gateway(server, sampling, clients, requests)
            base_rps, gw_rps = len(base) / base_wall, len(gw) / gw_wall
            print(f"{clients:>7} {'in-process':<11} {base_rps:>8.1f} {pct(base, 50) * 1e3:>9.1f} "
                  f"{pct(base, 99) * 1e3:>9.1f} {'':>10} {'':>10} {'1.00':>11}")
            print(f"{clients:>7} {'gateway':<11} {gw_rps:>8.1f} {pct(gw, 50) * 1e3:>9.1f} {pct(gw, 99) * 1e3:>9.1f} "
                  f"{(pct(gw, 50) - pct(base, 50)) * 1e3:>+9.1f}ms {(pct(gw, 99) - pct(base, 99)) * 1e3:>+9.1f}ms "
                  f"{gw_rps / base_rps:>11.2f}")
    finally:
        server.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16, 128])
    parser.add_argument("--requests", type=int, default=8, help="requests per client at each level")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    args = parser.parse_args()
    main(args.clients, args.requests, args.max_new_tokens)
