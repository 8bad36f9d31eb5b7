"""Live-monitoring latency: from the trainer's event sink accepting an event to a websocket client receiving it.

The whole real path runs: ``DatabaseEventSink.emit`` (queue) -> writer thread -> one transaction per batch
-> ``group_send`` on the Redis channel layer -> Daphne -> ``JobEventsConsumer`` -> 50 websocket clients
signed in with a session cookie. Each event carries the time it was accepted; every client records when it
arrives. The same run measures raw Redis pub/sub (one publisher, ``--redis-subscribers`` subscribers, same
rate) as the transport floor.

    python benchmarks/websocket_latency.py                       # 10 and 1,000 events/s, 50 clients
    python benchmarks/websocket_latency.py --clients 20 --seconds 3 --flush-interval 0.5   # the old window

The sink sends an event at once when it has sent nothing for ``1 / --max-messages`` seconds and batches only
under load (default the sink's own: 20 messages per second per job, no fixed window; ``--flush-interval``
makes every batch wait that long, as the sink did before). The bounds it is held to: p50 at most 100 ms at
10 events/s, p99 at most 500 ms at 1,000 events/s, with 50 clients. The raw Redis numbers show what the
transport alone costs; the last line is the ratio of websocket to raw Redis p50 latency at the highest
rate.

Needs Redis (``--redis-url``, default database 14 so it never meets a demo's groups) and uses a throwaway
SQLite database unless ``--database-url`` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def setup_django(database_url: str, redis_url: str) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "webapp.settings"
    os.environ.setdefault("DEBUG", "1")
    os.environ["DATABASE_URL"] = database_url
    os.environ["REDIS_URL"] = redis_url
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def make_job() -> tuple[int, str, str]:
    """A user, a team and a running job; returns (job id, session cookie name, value)."""
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client

    from webapp.accounts.models import do_create_team
    from webapp.jobs.models import Status, TrainingJob

    name = f"bench-{uuid.uuid4().hex[:8]}"
    user = get_user_model().objects.create_user(username=name, password=uuid.uuid4().hex)
    team = do_create_team(name, user)
    job = TrainingJob.objects.create(team=team, created_by=user, name="latency benchmark", config={},
                                     status=Status.RUNNING)
    client = Client()
    client.force_login(user)
    return job.pk, settings.SESSION_COOKIE_NAME, client.cookies[settings.SESSION_COOKIE_NAME].value


def start_daphne(port: int, log: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                             "webapp.asgi:application"], cwd=ROOT, env=dict(os.environ),
                            stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"daphne exited:\n{log.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise TimeoutError(f"daphne did not listen on {port}:\n{log.read_text()}")


class Clients:
    """``n`` websocket clients of one job; each records (run, latency) for every benchmark event."""

    def __init__(self, n: int, url: str, cookie: str) -> None:
        self.n, self.url, self.cookie = n, url, cookie
        self.latencies: dict[str, list[float]] = {}
        self.received: dict[str, int] = {}
        self.per_client: dict[tuple[int, str], int] = {}
        self.live = 0
        self.tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self.tasks = [asyncio.create_task(self._client(i)) for i in range(self.n)]
        deadline = time.monotonic() + 60
        while self.live < self.n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {self.live} of {self.n} websocket clients went live")
            for t in self.tasks:
                if t.done() and t.exception():
                    raise t.exception()  # type: ignore[misc]
            await asyncio.sleep(0.05)

    async def _client(self, index: int) -> None:
        import websockets

        headers = {"Cookie": self.cookie, "Origin": "http://127.0.0.1"}
        for attempt in range(5):  # 50 handshakes at once can outrun a busy server: retry, then give up
            try:
                ws = await websockets.connect(self.url, additional_headers=headers, max_size=None, open_timeout=30)
                break
            except (OSError, websockets.exceptions.InvalidMessage, TimeoutError):
                if attempt == 4:
                    raise
                await asyncio.sleep(0.5 * (attempt + 1))
        async with ws:
            async for raw in ws:
                now = time.time()
                message = json.loads(raw)
                if message["type"] == "live":
                    self.live += 1
                elif message["type"] == "events":
                    for event in message["events"]:
                        run = event["data"].get("bench_run")
                        if run is not None:
                            self.latencies.setdefault(run, []).append(now - event["data"]["accepted_at"])
                            self.received[run] = self.received.get(run, 0) + 1
                            self.per_client[index, run] = self.per_client.get((index, run), 0) + 1

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def emit_at_rate(job_id: int, run: str, rate: float, seconds: float, flush_interval: float,
                 max_messages: float) -> int:
    """Emit ``rate`` events per second for ``seconds`` through a real sink; returns the number emitted."""
    from trainer.events import log_event, metrics_event
    from webapp.monitor.sink import DatabaseEventSink

    sink = DatabaseEventSink(job_id, flush_interval=flush_interval, max_messages_per_second=max_messages)
    # Warm the path (the writer's first connection, Daphne's first group message) outside the measurement.
    sink.emit(log_event(0, "warm-up"))
    time.sleep(0.5)
    total = int(rate * seconds)
    start = time.perf_counter()
    for i in range(total):
        target = start + i / rate
        delay = target - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        sink.emit(metrics_event(i, {"bench_run": run, "accepted_at": time.time(), "value": i * 0.5}))  # type: ignore[dict-item]
    sink.close()
    return total


async def _client_process(conn: Any, url: str, cookie: str, n: int, redis_url: str) -> None:
    clients = Clients(n, url, cookie)
    try:
        await clients.start()
    except Exception as exc:
        conn.send(("error", f"websocket clients did not go live: {exc!r}"))
        return
    conn.send(("live", None))
    try:
        while True:
            command, arg = await asyncio.to_thread(conn.recv)
            if command == "stop":
                return
            if command == "collect":
                run, expected = arg
                deadline = time.monotonic() + 60
                while clients.received.get(run, 0) < expected * n and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                if clients.received.get(run, 0) < expected * n:
                    short = {i: clients.per_client.get((i, run), 0) for i in range(n)
                             if clients.per_client.get((i, run), 0) < expected}
                    dead = [repr(t.exception()) for t in clients.tasks
                            if t.done() and not t.cancelled() and t.exception()]
                    conn.send(("error", f"at {run} clients fell short: {short}; dead clients: {dead}"))
                else:
                    conn.send(("latencies", clients.latencies.pop(run)))
            elif command == "redis":
                channel, expected, subscribers = arg
                conn.send(("latencies", await redis_subscribers(conn, redis_url, channel, subscribers, expected)))
    finally:
        await clients.stop()


def client_process(conn: Any, url: str, cookie: str, n: int, redis_url: str) -> None:
    """The clients' own process: like browsers, they do not share the sink's interpreter (or its GIL)."""
    asyncio.run(_client_process(conn, url, cookie, n, redis_url))


async def redis_subscribers(conn: Any, redis_url: str, channel: str, n: int, expected: int) -> list[float]:
    """``n`` raw pub/sub subscribers; says "subscribed", then returns publish -> receive latencies."""
    import redis.asyncio as aioredis

    latencies: list[float] = []
    connections = [aioredis.from_url(redis_url) for _ in range(n)]
    subscribers = [c.pubsub() for c in connections]
    for sub in subscribers:
        await sub.subscribe(channel)
        await sub.get_message(timeout=1.0)  # the subscribe confirmation
    conn.send(("subscribed", None))

    async def listen(sub: Any) -> None:
        seen = 0
        async for message in sub.listen():
            if message["type"] != "message":
                continue
            latencies.append(time.time() - json.loads(message["data"])["accepted_at"])
            seen += 1
            if seen == expected:
                return

    await asyncio.wait_for(asyncio.gather(*(listen(sub) for sub in subscribers)), timeout=120)
    for sub in subscribers:
        await sub.aclose()
    for c in connections:
        await c.aclose()
    return latencies


def reply(conn: Any, want: str) -> Any:
    kind, value = conn.recv()
    if kind == "error":
        raise RuntimeError(value)
    if kind != want:
        raise RuntimeError(f"the client process answered {kind!r}, expected {want!r}")
    return value


def redis_publish(redis_url: str, channel: str, rate: float, total: int) -> None:
    import redis

    publisher = redis.Redis.from_url(redis_url)
    start = time.perf_counter()
    for i in range(total):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        publisher.publish(channel, json.dumps({"i": i, "accepted_at": time.time()}))
    publisher.close()


def run(args: argparse.Namespace, job_id: int, cookie_name: str, cookie_value: str) -> float:
    import multiprocessing

    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="ws-bench-")) / "daphne.log"
    daphne = start_daphne(port, log)
    parent, child = multiprocessing.get_context("spawn").Pipe()
    clients = multiprocessing.get_context("spawn").Process(
        target=client_process, args=(child, f"ws://127.0.0.1:{port}/ws/jobs/{job_id}/",
                                     f"{cookie_name}={cookie_value}", args.clients, args.redis_url), daemon=True)
    rows = []
    bounds = {10.0: ("p50", 50, 0.100), 1000.0: ("p99", 99, 0.500)}
    try:
        clients.start()
        reply(parent, "live")
        for rate in args.rates:
            seconds = max(args.seconds, 20 / rate)  # at least 20 events per setting
            run_name = f"{rate:g}/s"
            total = emit_at_rate(job_id, run_name, rate, seconds, args.flush_interval, args.max_messages)
            parent.send(("collect", (run_name, total)))
            ws = reply(parent, "latencies")
            channel = f"bench-{uuid.uuid4().hex}"
            parent.send(("redis", (channel, total, args.redis_subscribers)))
            reply(parent, "subscribed")
            redis_publish(args.redis_url, channel, rate, total)
            raw = reply(parent, "latencies")
            if len(raw) < total * args.redis_subscribers:
                raise RuntimeError(f"raw Redis: {len(raw)} of {total * args.redis_subscribers} messages arrived")
            rows.append((rate, ws, raw))
    finally:
        if clients.is_alive():
            parent.send(("stop", None))
            clients.join(30)
        daphne.terminate()
        daphne.wait(15)
        if daphne.returncode not in (0, -15):
            print(f"daphne log: {log}", file=sys.stderr)

    print(f"{args.clients} websocket clients (in their own process), sink flush interval {args.flush_interval} s, "
          f"at most {args.max_messages:g} messages/s per job; raw Redis: {args.redis_subscribers} subscriber(s)")
    print(f"{'events/s':>9} {'path':<28} {'p50 ms':>9} {'p99 ms':>9} {'samples':>9}")
    for rate, ws, raw in rows:
        print(f"{rate:>9g} {'sink -> websocket client':<28} {1000 * percentile(ws, 50):>9.1f} "
              f"{1000 * percentile(ws, 99):>9.1f} {len(ws):>9}")
        print(f"{rate:>9g} {'raw Redis publish -> recv':<28} {1000 * percentile(raw, 50):>9.2f} "
              f"{1000 * percentile(raw, 99):>9.2f} {len(raw):>9}")
    for rate, ws, _ in rows:
        if rate in bounds:
            name, q, limit = bounds[rate]
            value = percentile(ws, q)
            print(f"bound at {rate:g} events/s: {name} {1000 * value:.1f} ms <= {1000 * limit:.0f} ms: "
                  f"{'met' if value <= limit else 'NOT met'}")
    rate, ws, raw = rows[-1]
    ratio = statistics.median(ws) / max(statistics.median(raw), 1e-9)
    print(f"websocket / raw Redis p50 latency at {rate:g} events/s: {ratio:.1f}x")
    return ratio


def main(argv: list[str] | None = None) -> float:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=50, help="connected websocket clients (and Redis subscribers)")
    ap.add_argument("--rates", type=float, nargs="+", default=[10.0, 1000.0], help="events per second")
    ap.add_argument("--seconds", type=float, default=5.0, help="how long each rate runs")
    ap.add_argument("--flush-interval", type=float, default=0.0,
                    help="how long the first event of a batch waits for company (s); 0 = the sink's default")
    ap.add_argument("--max-messages", type=float, default=20.0, help="the sink's group messages per second")
    ap.add_argument("--redis-subscribers", type=int, default=1,
                    help="raw pub/sub subscribers (one shows the transport floor; 50 Python decoders of 1,000 "
                         "messages/s each measure the client process, not Redis)")
    ap.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14"))
    ap.add_argument("--database-url", default=None, help="default: a throwaway SQLite file")
    args = ap.parse_args(argv)
    if args.clients < 1 or args.redis_subscribers < 1 or any(r <= 0 for r in args.rates):
        ap.error("--clients, --redis-subscribers and --rates must be positive")
    database_url = args.database_url or f"sqlite:///{tempfile.mkdtemp(prefix='ws-bench-db-')}/bench.sqlite3"
    setup_django(database_url, args.redis_url)
    return run(args, *make_job())


if __name__ == "__main__":
    main()
