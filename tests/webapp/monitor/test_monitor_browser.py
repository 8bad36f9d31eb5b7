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


@pytest.fixture
def asgi_server(transactional_db: None, runs_dir: Path, tmp_path: Path) -> Iterator[str]:
    """Daphne serving ``webapp.asgi`` against this test's database, stopped after the test."""
    from django.db import connection

    connection.ensure_connection()
    port = free_port()
    log = (tmp_path / "daphne.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                             "webapp.asgi:application"], cwd=ROOT, env=worker_env(runs_dir), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)

    def answering() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"daphne exited: {(tmp_path / 'daphne.log').read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            return False

    try:
        wait_for(answering, 60, "daphne to listen")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


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
        from django.db import connection

        from agentfly.resources import Pool, ResourceEngine, ResourceSpec
        from agentfly.resources.scratchpad import Scratchpad
        from webapp.monitor.sampling import resource_snapshot
        from webapp.monitor.sink import DatabaseEventSink

        spec = ResourceSpec(name="scratchpad", factory=Scratchpad, kind="other", pool=Pool(min=1, max=4))
        sink = DatabaseEventSink(self.job_id, flush_interval=0.2)
        try:
            async with ResourceEngine([spec]) as engine:
                tick = 0
                while not self.stop.is_set():
                    leases = [await engine.acquire("scratchpad", owner=f"r{tick}-{i}") for i in range(1 + tick % 4)]
                    sink.emit({"type": "resources", **resource_snapshot(engine.stats())})
                    await asyncio.sleep(0.3)
                    for lease in leases:
                        await engine.release(lease)
                    tick += 1
        finally:
            await asyncio.to_thread(sink.close)
            connection.close()

    def __enter__(self) -> PoolReporter:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def test_the_dashboard_grows_live_shows_rollouts_and_pools_and_cancels_the_job(
        alice: Any, alice_api: Any, builtins: dict[str, Any], asgi_server: str) -> None:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get update && apt-get install -y chromium")
    from django.conf import settings
    from django.test import Client
    from playwright.sync_api import sync_playwright

    from webapp.jobs.models import Status, TrainingJob
    from webapp.monitor.models import JobEvent

    response = alice_api.post("/api/jobs/", {
        "name": "tiny live", "team": "team-a", "tools": [builtins["calculator"].pk],
        "reward": builtins["math_equal"].pk, "steps": 300, "prompts_per_step": 2, "group_size": 2,
        "max_turns": 2, "max_new_tokens": 12, "eval_size": 2, "save_every": 0,
    }, format="json")
    assert response.status_code == 201, response.content
    job_id = response.json()["id"]
    client = Client()
    client.force_login(alice)
    cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
    ARTIFACTS.mkdir(exist_ok=True)

    with PoolReporter(job_id), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        context = browser.new_context(viewport={"width": 1440, "height": 1800})
        context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": cookie, "url": asgi_server}])
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{asgi_server}/monitor/jobs/{job_id}/")
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
        stored = {e.step: e.data["reward/mean"] for e in JobEvent.objects.filter(job_id=job_id, type="metrics")}
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
        assert not errors, errors
        browser.close()

    job = TrainingJob.objects.get(pk=job_id)
    assert job.status == Status.CANCELLED and job.step < 300
    assert (ARTIFACTS / "monitor-dashboard.png").stat().st_size > 10_000
