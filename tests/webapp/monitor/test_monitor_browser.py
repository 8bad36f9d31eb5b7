"""The dashboard in a real browser: a tiny CPU job trains on a real Celery worker, Daphne serves the page and
its websocket, and headless Debian Chromium (driven by Playwright) watches it grow, then cancels it.

Needs ``/usr/bin/chromium`` (``apt-get install -y chromium``) and the ``playwright`` package; the browser that
``playwright install`` would download is never used. The screenshot lands in ``test-artifacts/``.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.webapp.conftest import ROOT, wait_for, worker_env

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
ARTIFACTS = ROOT / "test-artifacts"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Daphne:
    """``daphne webapp.asgi:application`` as a subprocess on a fixed port; ``restart`` keeps the port, so a
    page's socket sees the server go away and come back."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env, self.log_path = env, log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port),
                                      "webapp.asgi:application"], cwd=ROOT, env=self.env, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
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


@pytest.fixture
def daphne(transactional_db: None, runs_dir: Path, tmp_path: Path, private_channel_layer: str) -> Iterator[Daphne]:
    """Daphne serving the app against this test's database and channel layer, stopped after the test."""
    from django.db import connection

    connection.ensure_connection()
    server = Daphne({**worker_env(runs_dir), "CHANNEL_LAYER_PREFIX": private_channel_layer},
                    tmp_path / "daphne.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def browser_page() -> Iterator[Any]:
    """A headless Debian Chromium page (Playwright's sync API)."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get update && apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs its own event loop on this thread: from here on the tests touch the
    # database only through ``off_loop``.
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        context = browser.new_context(viewport={"width": 1440, "height": 1800})
        page = context.new_page()
        page.errors = []
        page.on("pageerror", lambda exc: page.errors.append(str(exc)))
        try:
            yield page
        finally:
            browser.close()


def off_loop(fn: Any, *args: Any) -> Any:
    """Call ``fn`` on a thread of its own. Playwright's loop runs on the test's thread, and storing events
    there would announce them with ``async_to_sync``, which refuses to run beside a running loop."""
    from django.db import connection

    result: list[Any] = []

    def call() -> None:
        try:
            result.append(fn(*args))
        except BaseException as exc:
            result.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=call)
    thread.start()
    thread.join()
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


def sign_in(page: Any, user: Any, base_url: str) -> None:
    from django.conf import settings
    from django.test import Client

    def session_key() -> str:
        client = Client()
        client.force_login(user)
        return client.cookies[settings.SESSION_COOKIE_NAME].value

    page.context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "url": base_url, "value": off_loop(session_key)}])


class PoolReporter:
    """A real ``ResourceEngine`` whose pool is busy while the job runs, reporting ``pools`` stats into the
    job's event stream through the worker's own ``DatabaseEventSink``.

    The trainer's ``resources`` events carry the worker's CPU, memory and GPUs but no pools yet (it does not
    hold a ResourceEngine for the calculator task), so this stands in for that part of the stream: same sink,
    same database rows, same socket; only the producer differs.
    """

    def __init__(self, job_id: int) -> None:
        self.job_id = job_id
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        from agentfly.resources import Pool, ResourceEngine, ResourceSpec
        from agentfly.resources.scratchpad import Scratchpad
        from trainer.events import host_stats
        from webapp.monitor.sink import DatabaseEventSink

        spec = ResourceSpec(name="scratchpad", factory=Scratchpad, kind="other", pool=Pool(min=1, max=4))
        sink = DatabaseEventSink(self.job_id, flush_interval=0.2)
        try:
            async with ResourceEngine([spec]) as engine:
                tick = 0
                while not self.stop.is_set():
                    leases = [await engine.acquire("scratchpad", owner=f"r{tick}-{i}") for i in range(1 + tick % 4)]
                    sink.emit({"type": "resources",
                               "data": {"host": host_stats(), "engine": {}, "pools": engine.stats()}})
                    await asyncio.sleep(0.3)
                    for lease in leases:
                        await engine.release(lease)
                    tick += 1
        finally:
            await asyncio.to_thread(sink.close)

    def __enter__(self) -> PoolReporter:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def test_the_dashboard_grows_live_shows_rollouts_and_pools_and_cancels_the_job(
        alice: Any, alice_api: Any, builtins: dict[str, Any], daphne: Daphne, browser_page: Any) -> None:
    from webapp.jobs.models import Status, TrainingJob
    from webapp.monitor.models import JobEvent

    response = off_loop(lambda: alice_api.post("/api/jobs/", {
        "name": "tiny live", "team": "team-a", "tools": [builtins["calculator"].pk],
        "reward": builtins["math_equal"].pk, "steps": 300, "prompts_per_step": 2, "group_size": 2,
        "max_turns": 2, "max_new_tokens": 12, "eval_size": 2, "save_every": 0,
    }, format="json"))
    assert response.status_code == 201, response.content
    job_id = response.json()["id"]
    page = browser_page
    sign_in(page, alice, daphne.url)
    ARTIFACTS.mkdir(exist_ok=True)

    with PoolReporter(job_id):
        page.goto(f"{daphne.url}/monitor/jobs/{job_id}/")
        page.wait_for_function("document.getElementById('connection').dataset.state === 'live'", timeout=30_000)
        at_load = int(page.get_attribute("#chart-reward", "data-points") or 0)

        # At least ten reward points arrive live, without a reload.
        page.wait_for_function(
            f"Number(document.getElementById('chart-reward').dataset.points) >= {at_load + 10}", timeout=300_000)
        assert page.url.endswith(f"/monitor/jobs/{job_id}/")

        # The plotted numbers are the stored numbers, in step order.
        plotted = page.evaluate("""() => {
            const raw = document.getElementById('chart-reward').data.find((t) => t.mode === 'lines+markers');
            return {x: Array.from(raw.x), y: Array.from(raw.y)};
        }""")
        stored = off_loop(lambda: {e.step: e.data["reward/mean"]
                                   for e in JobEvent.objects.filter(job_id=job_id, type="metrics")})
        assert plotted["x"] == sorted(plotted["x"])
        assert plotted["y"] == [pytest.approx(stored[s]) for s in plotted["x"]]

        # A trajectory with trained (mask 1) and masked (mask 0) tokens coloured apart, logprobs on hover.
        page.wait_for_selector("#token-view .tok.m1", timeout=60_000)
        colours = page.evaluate("""() => ['m0', 'm1'].map((m) => getComputedStyle(
            document.querySelector('#token-view .tok.' + m)).backgroundColor)""")
        assert colours[0] != colours[1]
        title = page.get_attribute("#token-view .tok.m1", "title") or ""
        assert "logprob" in title
        assert page.locator("#token-view .tok.m0").count() > 0

        # Pool bars and the pool table.
        page.wait_for_function("document.querySelectorAll('#pool-bars .barlayer .point').length > 0", timeout=60_000)
        assert "scratchpad" in page.inner_text("#pool-stats")
        assert page.inner_text("#gpu-absent").startswith("absent")
        page.screenshot(path=str(ARTIFACTS / "monitor-dashboard.png"), full_page=True)

        # Cancel from the page; the status badge changes live.
        page.click("#cancel-button")
        page.wait_for_function("document.getElementById('job-status').dataset.status === 'cancelled'",
                               timeout=180_000)
        page.screenshot(path=str(ARTIFACTS / "monitor-dashboard-cancelled.png"), full_page=True)
    assert not page.errors, page.errors
    job = off_loop(lambda: TrainingJob.objects.get(pk=job_id))
    assert job.status == Status.CANCELLED and job.step < 300
    assert (ARTIFACTS / "monitor-dashboard.png").stat().st_size > 10_000


def test_a_page_whose_server_restarts_reconnects_and_resumes_without_gap_or_duplicate(
        alice: Any, alice_job: Any, daphne: Daphne, browser_page: Any) -> None:
    from webapp.monitor.events import append_events

    def metrics(steps: range) -> None:
        off_loop(append_events, alice_job.pk, [{"type": "metrics", "step": s, "reward_mean": s / 10} for s in steps])

    page = browser_page
    sign_in(page, alice, daphne.url)
    metrics(range(1, 6))
    page.goto(f"{daphne.url}/monitor/jobs/{alice_job.pk}/")
    page.wait_for_function("document.getElementById('chart-reward').dataset.points === '5'", timeout=30_000)

    daphne.stop()
    page.wait_for_function("document.getElementById('connection').dataset.state === 'reconnecting'",
                           timeout=30_000)
    metrics(range(6, 9))  # stored while the page cannot hear anything
    daphne.start()
    page.wait_for_function("document.getElementById('connection').dataset.state === 'live'", timeout=60_000)
    metrics(range(9, 11))  # live again
    page.wait_for_function("document.getElementById('chart-reward').dataset.points === '10'", timeout=30_000)
    plotted = page.evaluate("""() => {
        const raw = document.getElementById('chart-reward').data.find((t) => t.mode === 'lines+markers');
        return {x: Array.from(raw.x), y: Array.from(raw.y)};
    }""")
    assert plotted["x"] == list(range(1, 11))
    assert plotted["y"] == [pytest.approx(s / 10) for s in range(1, 11)]
    assert "last #10" in page.inner_text("#event-count")
    assert not page.errors, page.errors


def test_the_compare_page_overlays_several_jobs_and_the_toggles_change_only_the_display(
        alice: Any, alice_job: Any, daphne: Daphne, browser_page: Any) -> None:
    from webapp.jobs.models import TrainingJob
    from webapp.monitor.events import append_events

    other = off_loop(lambda: TrainingJob.objects.create(team=alice_job.team, created_by=alice, name="baseline",
                                                        config={}))
    for job, scale in ((alice_job, 1.0), (other, 2.0)):
        off_loop(append_events, job.pk, [{"type": "metrics", "step": s, "reward_mean": scale * s, "kl": 0.01 * s}
                                         for s in range(1, 8)])
    page = browser_page
    sign_in(page, alice, daphne.url)
    page.goto(f"{daphne.url}/monitor/compare/?jobs={alice_job.pk},{other.pk}")
    page.wait_for_function("""() => {
        const div = document.getElementById('chart-reward');
        return div.data && div.data.filter((t) => t.mode === 'lines+markers' && t.x.length === 7).length === 2;
    }""", timeout=30_000)
    names = page.evaluate("""() => document.getElementById('chart-reward').data
        .filter((t) => t.mode === 'lines+markers').map((t) => t.name)""")
    assert names == [f"#{alice_job.pk} tiny arithmetic", f"#{other.pk} baseline"]

    page.check("#log-toggle")
    assert page.evaluate("document.getElementById('chart-kl').layout.yaxis.type") == "log"
    page.check("#smooth-toggle")
    page.wait_for_function("""() => document.getElementById('chart-reward').data
        .some((t) => t.name.endsWith('(smoothed)') && t.visible === true)""", timeout=5_000)
    raw = page.evaluate("""() => document.getElementById('chart-reward').data
        .filter((t) => t.mode === 'lines+markers').map((t) => Array.from(t.y))""")
    assert raw == [[float(s) for s in range(1, 8)], [2.0 * s for s in range(1, 8)]], "smoothing never alters data"
    assert not page.errors, page.errors
