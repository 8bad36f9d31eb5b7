"""The browser tests' problem watcher: a request the page gave up because it navigated away is the browser's
housekeeping and never fails a test; a request that fails on its own (a refused connection, an abort with
no navigation) always does.

A small HTTP server of the test's own answers slowly where asked, so a navigation overtakes a request in
flight as the favicon's did on a fresh machine.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.e2e.conftest import watch_for_problems
from tests.webapp.helpers import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PAGES = {
    "/": b"<!doctype html><title>first</title><img src='/slow.svg'><p>first page</p>",
    "/next": b"<!doctype html><title>next</title><p>next page</p>",
}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/slow.svg":
            time.sleep(3)  # still loading when the test navigates away
        body = PAGES.get(self.path, b"<svg xmlns='http://www.w3.org/2000/svg'/>")
        self.send_response(200)
        self.send_header("Content-Type", "image/svg+xml" if self.path.endswith(".svg") else "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the browser left
            self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def slow_site() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_request_aborted_because_the_page_navigated_away_is_not_a_problem(
        slow_site: str, browser_page: Any) -> None:
    page = browser_page
    problems = watch_for_problems(page)
    failed: list[str] = []
    page.on("requestfailed", lambda r: failed.append(r.failure or ""))
    page.goto(f"{slow_site}/", wait_until="domcontentloaded")
    page.goto(f"{slow_site}/next")
    page.wait_for_load_state("load")
    assert any("ERR_ABORTED" in f for f in failed), "the slow image was aborted by the navigation"
    assert problems == []


def test_a_refused_connection_and_an_abort_without_navigation_are_problems(
        slow_site: str, browser_page: Any) -> None:
    page = browser_page
    problems = watch_for_problems(page)
    page.goto(f"{slow_site}/next")
    closed = f"http://127.0.0.1:{free_port()}/nothing-listens"
    page.evaluate("(url) => fetch(url).catch(() => null)", closed)
    page.evaluate("""(url) => { const c = new AbortController(); const p = fetch(url, {signal: c.signal})
        .catch(() => null); setTimeout(() => c.abort(), 200); return p; }""", f"{slow_site}/slow.svg")
    page.wait_for_timeout(300)
    assert any("nothing-listens" in p for p in problems), problems
    assert any("slow.svg" in p and "ERR_ABORTED" in p for p in problems), problems
