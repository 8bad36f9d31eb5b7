"""The README's first command in a real browser: ``python -m webapp.demo`` (the key chain from its shipped
warm start, its default 80 steps) serves a dashboard whose reward chart rises above its first points while the
job runs. Screenshots of the dashboard mid-run and of the rollout viewer land in ``test-artifacts/``.

The values are read from the page itself (Plotly's ``gd.data`` of the reward chart), as the user sees them.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.webapp.helpers import sign_in_with_the_form, wait_for_js
from tests.webapp.test_demo_stop import descendants, start_demo_in_background

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
FIRST = 3  # the points the rise is measured from
REWARD = """() => {
    const div = document.getElementById('chart-reward');
    const raw = div && div.data && div.data.find((t) => t.meta === 'raw');
    return raw ? {x: Array.from(raw.x), y: Array.from(raw.y)} : null;
}"""


def dashboard_url(proc: Any, timeout: float = 300) -> str:
    """The dashboard line the demo prints once its job is launched (after the worker is up)."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        if line.strip().startswith("dashboard"):
            return line.split()[-1]
    raise AssertionError("the demo never printed its dashboard URL:\n" + "".join(seen))


def risen(reward: dict[str, list[float]] | None) -> bool:
    """The latest points clearly above the first ones: their mean beats the first points' mean by 0.05."""
    if not reward or len(reward["y"]) < FIRST + 5:
        return False
    first, latest = reward["y"][:FIRST], reward["y"][-5:]
    return sum(latest) / len(latest) > sum(first) / len(first) + 0.05


@pytest.mark.timeout(1500)
def test_the_demo_dashboard_shows_the_reward_rising_while_the_job_runs(tmp_path: Path, browser_page: Any) -> None:
    started = time.monotonic()
    proc, port = start_demo_in_background(tmp_path, ())  # as the README runs it: no options
    try:
        url = dashboard_url(proc)
        base = f"http://127.0.0.1:{port}"
        page = browser_page
        sign_in_with_the_form(page, base, "demo", "agentfly-demo")
        page.goto(url)
        wait_for_js(page, f"() => {{ const r = ({REWARD})(); return r && r.y.length >= {FIRST}; }}", timeout=600_000)
        first = page.evaluate(REWARD)
        # Poll the chart the page draws as live events arrive, while the job is still running.
        deadline = time.monotonic() + 900
        reward = first
        while not risen(reward):
            assert time.monotonic() < deadline, f"the reward never rose above its first points: {reward}"
            assert page.get_attribute("#job-status", "data-status") in ("queued", "running"), \
                f"the job ended before its reward rose: {reward}"
            time.sleep(2)
            reward = page.evaluate(REWARD)
        status = page.get_attribute("#job-status", "data-status")
        assert status == "running", f"the rise must be seen while the job runs, not after (status {status})"
        ARTIFACTS.mkdir(exist_ok=True)
        shot = ARTIFACTS / "demo-dashboard-mid-run.png"
        page.screenshot(path=str(shot), full_page=True)
        wait_for_js(page, "() => document.querySelectorAll('#rollout-list .rollout-item').length > 0", timeout=60_000)
        viewer = ARTIFACTS / "demo-rollout-viewer.png"
        page.locator("section:has(#rollout-list)").screenshot(path=str(viewer))
        print(f"\nreward at steps {first['x'][:FIRST]}: {first['y'][:FIRST]}; at steps {reward['x'][-5:]}: "
              f"{reward['y'][-5:]} ({time.monotonic() - started:.0f} s after the demo started)")
        print(f"screenshots: {shot} and {viewer}")
        assert shot.stat().st_size > 10_000 and viewer.stat().st_size > 5_000
        assert page.errors == []
    finally:
        started_procs = descendants(proc.pid) if proc.poll() is None else []
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except Exception:
                os.killpg(proc.pid, signal.SIGKILL)
        psutil.wait_procs(started_procs, timeout=10)
