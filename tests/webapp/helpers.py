"""Helpers the web app's tests share: real Celery worker and Daphne processes, and waiting for a condition.

Kept out of ``conftest.py`` so test modules import them as an ordinary module.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "correct horse battery staple"


class Worker:
    """A ``celery worker`` subprocess; ``kill()`` ends it the way a crashed machine would (SIGKILL)."""

    def __init__(self, queues: str, env: dict[str, str], log: Path, host: str = "%h", concurrency: int = 1) -> None:
        # ``host``: the host the worker's name says it is on (Celery's ``%h``, this machine, by default);
        # two workers named for two hosts stand in for two machines in the multi-node tests.
        self.name = f"test-{queues.replace(',', '-')}-{uuid.uuid4().hex[:6]}@{host}"
        self.log = log
        self._fh = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "webapp", "worker", "-Q", queues, "-c", str(concurrency), "-n", self.name,
             "--without-gossip", "--without-mingle", "-l", "info"],
            cwd=ROOT, env=env, stdout=self._fh, stderr=subprocess.STDOUT, start_new_session=True,
        )

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the celery worker exited with {self.proc.returncode}:\n{self.log.read_text()}")
            if b"ready." in self.log.read_bytes():
                return
            time.sleep(0.2)
        raise TimeoutError(f"the celery worker did not start in {timeout} s:\n{self.log.read_text()}")

    def kill(self) -> None:
        """SIGKILL the worker and its pool children (its own process group)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
        self._fh.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Daphne:
    """``daphne webapp.asgi:application`` as a subprocess on a fixed port; ``stop`` then ``start`` keeps the
    port, so a page's socket sees the server go away and come back."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env, self.log_path = env, log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "webapp.serve", "-b", "127.0.0.1", "-p", str(self.port),
                                          "webapp.asgi:application"], cwd=ROOT, env=self.env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(self._answering, 60, "daphne to listen")

    def _answering(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"daphne exited: {self.log_path.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
            return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def worker_env(runs: Path) -> dict[str, str]:
    """The environment of a worker that shares this test session's database, Redis and runs folder."""
    from django.conf import settings
    from django.db import connection

    db = connection.settings_dict
    if connection.vendor == "sqlite":  # the demo's settings: the worker opens the session's test file
        url = f"sqlite:///{db['NAME']}"
    else:
        url = f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    env = dict(os.environ)
    env.update({
        "SECRET_KEY": settings.SECRET_KEY,  # a worker holds one; what it runs must not see it
        "DATABASE_URL": url,
        "AGENTFLY_RUNS_DIR": str(runs),
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
    })
    return env


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def wait_for_js(page: Any, expression: str, timeout: float, interval: float = 0.2) -> Any:
    """Poll a JavaScript expression (or ``() => ...`` function) in ``page`` until it is truthy.

    Playwright's ``wait_for_function`` given a bare expression evaluates it with ``eval`` inside the page once
    its first check fails, which the app's Content-Security-Policy (no ``'unsafe-eval'``) rightly forbids (a
    ``() => ...`` function works there too); ``page.evaluate`` goes through the DevTools protocol, so the page
    keeps its real policy while the test waits; a navigation while it runs is polled again, on the new
    document. ``timeout`` is in milliseconds, as Playwright's own waits take it.
    """
    from playwright.sync_api import Error as PlaywrightError

    deadline = time.monotonic() + timeout / 1000
    while True:
        try:
            value = page.evaluate(expression)
        except PlaywrightError as exc:
            # A page that reloads itself (an inspection's status page does when it ends) can navigate while
            # the expression runs: the next poll asks the new document.
            if "Execution context was destroyed" not in str(exc):
                raise
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout / 1000:.0f} s waiting for {expression!r}")
        page.wait_for_timeout(interval * 1000)


def off_loop(fn: Any, *args: Any) -> Any:
    """Call ``fn`` on a thread of its own (the worker's ``off_loop``). Playwright's loop runs on the test's
    thread, and storing events there would announce them with ``async_to_sync``, which refuses to run beside a
    running loop."""
    from webapp.jobs.tasks import off_loop as on_a_thread

    return on_a_thread(fn, *args)


def sign_in(page: Any, user: Any, base_url: str) -> None:
    from django.conf import settings
    from django.test import Client

    def session_key() -> str:
        client = Client()
        client.force_login(user)
        return client.cookies[settings.SESSION_COOKIE_NAME].value

    page.context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "url": base_url, "value": off_loop(session_key)}])


def sign_in_with_the_form(page: Any, base_url: str, username: str = "alice", password: str = PASSWORD,
                          next_path: str | None = None) -> None:
    """Sign in as a user does, through the login form (``sign_in`` above sets the session cookie instead),
    and wait until the page has left the form (for ``next_path`` when given)."""
    page.goto(f"{base_url}/login/" + (f"?next={next_path}" if next_path else ""))
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/login/" not in url)
