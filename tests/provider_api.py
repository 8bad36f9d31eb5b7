"""A provider's HTTP API on loopback for the rate-limit tests: it records when each request arrived, by path,
and with a ``limit`` enforces it as a provider would (429 with ``Retry-After: 1``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ProviderAPI(ThreadingHTTPServer):
    """Answers 200 and records the arrival; with ``limit``, a request that would make more than ``limit``
    accepted in the last second (all paths together) is refused with 429 and counted in ``rejected``."""

    def __init__(self, limit: int | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.limit = limit
        self.by_path: dict[str, list[float]] = {}
        self.rejected = 0
        self.lock = threading.Lock()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{path}"

    @property
    def arrivals(self) -> list[float]:
        """When each accepted request arrived, every path together."""
        with self.lock:
            return sorted(t for times in self.by_path.values() for t in times)


class _Handler(BaseHTTPRequestHandler):
    server: ProviderAPI

    def do_GET(self) -> None:
        now, api = time.monotonic(), self.server
        with api.lock:
            recent = sum(1 for times in api.by_path.values() for t in times if now - t < 1.0)
            allowed = api.limit is None or recent < api.limit
            if allowed:
                api.by_path.setdefault(self.path, []).append(now)
            else:
                api.rejected += 1
        self.send_response(200 if allowed else 429)
        if not allowed:
            self.send_header("Retry-After", "1")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serving(limit: int | None = None) -> Iterator[ProviderAPI]:
    server = ProviderAPI(limit)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def most_in_one_second(times: list[float]) -> int:
    """The most arrivals in any one-second window."""
    times, best, lo = sorted(times), 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] >= 1.0:
            lo += 1
        best = max(best, hi - lo + 1)
    return best
