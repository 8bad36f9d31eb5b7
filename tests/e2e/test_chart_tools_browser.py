"""The dashboard's charts as a W&B or TensorBoard user works them: a zoom or a hover on one chart shows on
every chart; each chart has its own log scale and smoothing; the x axis is the step, the wall time or the
tokens trained; a search box narrows the charts; charts pinned or hidden stay so for the user after a reload;
a chart's data downloads as CSV and JSON; the head shows an ETA from the recent step time.

The job is a stored row with 30 steps of the trainer's payloads (``webapp.monitor.synthetic``: one second
apart, 1.2 s steps) out of 40; Daphne serves it and Debian's Chromium reads it.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import watch_for_problems
from tests.webapp.helpers import Daphne, off_loop, sign_in, wait_for_js

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "charts"
DRAWN = "() => document.body.dataset.history === 'drawn'"
RAW = """(id) => { const t = document.getElementById(id).data.find((d) => d.meta === 'raw'); return Array.from(t.x); }"""


def long_job(alice: Any) -> Any:
    from webapp.accounts.models import Team
    from webapp.jobs.models import TrainingJob
    from webapp.monitor.synthetic import seed_long_job

    job = TrainingJob.objects.create(team=Team.objects.of(alice).get(), created_by=alice, name="thirty of forty",
                                     status="running", config={"steps": 40}, step=30)
    seed_long_job(job, 30)
    return job


@pytest.fixture
def opened(alice: Any, daphne: Daphne, browser_page: Any) -> tuple[Any, Any, list[str]]:
    job = off_loop(long_job, alice)
    page = browser_page
    problems = watch_for_problems(page, daphne.url)
    sign_in(page, alice, daphne.url)
    page.goto(f"{daphne.url}/monitor/jobs/{job.pk}/")
    wait_for_js(page, DRAWN, timeout=30_000)
    wait_for_js(page, "() => document.getElementById('chart-kl').layout", timeout=10_000)
    return job, page, problems


def tool(page: Any, chart: str, action: str) -> Any:
    return page.locator(f".chart[data-chart='{chart}'] .chart-tool[data-action='{action}']")


def test_a_zoom_and_a_hover_on_one_chart_show_on_every_chart(opened: tuple[Any, Any, list[str]]) -> None:
    _, page, problems = opened
    page.evaluate("() => { Plotly.relayout('chart-reward', {'xaxis.range': [10, 20]}); }")
    wait_for_js(page, "() => JSON.stringify(document.getElementById('chart-kl').layout.xaxis.range) === '[10,20]'",
                timeout=10_000)
    assert page.evaluate("() => document.getElementById('chart-entropy').layout.xaxis.range") == [10, 20]
    box = page.locator("#chart-reward .nsewdrag").first.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    wait_for_js(page, "() => document.querySelectorAll('#chart-kl .hoverlayer .hovertext').length > 0", timeout=5_000)
    page.wait_for_load_state("networkidle")
    assert problems == []


def test_each_chart_has_its_own_log_scale_and_smoothing(opened: tuple[Any, Any, list[str]]) -> None:
    _, page, _ = opened
    tool(page, "kl", "log").click()
    wait_for_js(page, "() => document.getElementById('chart-kl').layout.yaxis.type === 'log'", timeout=5_000)
    assert page.evaluate("() => document.getElementById('chart-entropy').layout.yaxis.type") == "linear"
    assert tool(page, "kl", "log").get_attribute("aria-pressed") == "true"
    tool(page, "reward", "smooth").click()
    smoothed = """(id) => document.getElementById(id).data.filter((t) => (t.name || '').endsWith('(smoothed)')).map((t) => t.visible)"""
    wait_for_js(page, f"() => ({smoothed})('chart-reward')[0] === true", timeout=5_000)
    assert page.evaluate(smoothed, "chart-kl") == [False]


def test_the_x_axis_can_be_the_step_the_wall_time_or_the_tokens_trained(opened: tuple[Any, Any, list[str]]) -> None:
    _, page, _ = opened
    assert page.evaluate(RAW, "chart-reward")[:3] == [1, 2, 3]
    page.select_option("#x-axis", "time")
    wait_for_js(page, "() => document.getElementById('chart-reward').layout.xaxis.title.text.startsWith('wall time')",
                timeout=5_000)
    assert page.evaluate(RAW, "chart-reward")[:3] == [0, 1, 2]  # one second apart, from the first step
    page.select_option("#x-axis", "tokens")
    wait_for_js(page, "() => document.getElementById('chart-reward').layout.xaxis.title.text === 'trained tokens'",
                timeout=5_000)
    tokens = page.evaluate(RAW, "chart-reward")
    assert len(tokens) == 30 and all(b > a > 0 for a, b in itertools.pairwise(tokens)), tokens[:5]


def test_the_search_box_narrows_the_charts_to_the_metrics_it_names(opened: tuple[Any, Any, list[str]]) -> None:
    _, page, _ = opened
    page.fill("#metric-search", "entropy")
    shown = "() => [...document.querySelectorAll('#charts .chart')].filter((c) => c.offsetParent !== null).map((c) => c.dataset.chart)"
    wait_for_js(page, f"() => ({shown})().length === 1", timeout=5_000)
    assert page.evaluate(shown) == ["entropy"]
    page.fill("#metric-search", "")
    wait_for_js(page, f"() => ({shown})().length > 10", timeout=5_000)


def test_pinned_and_hidden_charts_stay_so_for_the_user_after_a_reload(opened: tuple[Any, Any, list[str]]) -> None:
    _job, page, problems = opened
    tool(page, "kl", "pin").click()
    tool(page, "entropy", "hide").click()
    first = """() => [...document.querySelectorAll('#charts .chart')].filter((c) => c.offsetParent !== null)
        .sort((a, b) => a.offsetTop - b.offsetTop || a.offsetLeft - b.offsetLeft)[0].dataset.chart"""
    assert page.evaluate(first) == "kl"
    assert not page.locator(".chart[data-chart='entropy']").is_visible()
    page.reload()
    page.wait_for_function(DRAWN, timeout=30_000)
    assert page.evaluate(first) == "kl"
    assert not page.locator(".chart[data-chart='entropy']").is_visible()
    assert page.inner_text("#show-hidden") == "show hidden charts (1)"
    assert "alice" in page.evaluate("() => Object.keys(localStorage).join(' ')")  # kept per user
    page.click("#show-hidden")
    wait_for_js(page, "() => document.querySelector(\".chart[data-chart='entropy']\").offsetParent !== null", timeout=5_000)
    wait_for_js(page, "() => document.getElementById('chart-entropy').data", timeout=5_000)
    page.wait_for_load_state("networkidle")
    assert problems == []


def test_a_charts_data_downloads_as_csv_and_json(opened: tuple[Any, Any, list[str]], tmp_path: Path) -> None:
    _, page, _ = opened
    with page.expect_download() as csv_download:
        tool(page, "tool_calls", "csv").click()
    assert csv_download.value.suggested_filename == "tool_calls.csv"
    rows = list(csv.reader(io.StringIO(Path(csv_download.value.path()).read_text())))
    assert rows[0] == ["step", "tool calls mean", "turns mean"] and len(rows) == 31
    assert [r[0] for r in rows[1:4]] == ["1", "2", "3"] and float(rows[1][2]) == 2.0
    with page.expect_download() as json_download:
        tool(page, "reward", "json").click()
    data = json.loads(Path(json_download.value.path()).read_text())
    assert data["title"] == "Reward" and data["lines"][0]["step"] == list(range(1, 31))
    assert len(data["lines"][0]["value"]) == 30


def test_the_head_shows_an_eta_from_the_recent_step_time(opened: tuple[Any, Any, list[str]]) -> None:
    _, page, _ = opened
    wait_for_js(page, "() => document.getElementById('job-eta').dataset.seconds", timeout=5_000)
    seconds = int(page.get_attribute("#job-eta", "data-seconds"))
    assert 10 <= seconds <= 14, seconds  # 10 steps left of about 1.2 s each
    assert page.inner_text("#job-eta").startswith("ETA ")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.locator(".monitor-head").screenshot(path=str(ARTIFACTS / "dashboard-head-eta.png"))


def test_the_chart_view_is_kept_in_the_url_so_a_link_opens_the_same_view(opened: tuple[Any, Any, list[str]]) -> None:
    job, page, problems = opened
    page.select_option("#x-axis", "time")
    page.check("#log-toggle")
    page.check("#smooth-toggle")
    page.fill("#metric-search", "entropy")
    query = page.evaluate("() => Object.fromEntries(new URLSearchParams(location.search))")
    assert query == {"x": "time", "log": "1", "smooth": "0.60", "q": "entropy"}
    link = page.url
    page.goto(link)  # as a colleague opens the link
    wait_for_js(page, DRAWN, timeout=30_000)
    assert page.evaluate("() => [document.getElementById('x-axis').value, document.getElementById('log-toggle').checked, "
                         "document.getElementById('smooth-toggle').checked, document.getElementById('metric-search').value]"
                         ) == ["time", True, True, "entropy"]
    shown = "() => [...document.querySelectorAll('#charts .chart')].filter((c) => c.offsetParent !== null).map((c) => c.dataset.chart)"
    wait_for_js(page, f"() => ({shown})().length === 1", timeout=5_000)
    assert page.evaluate(shown) == ["entropy"]
    wait_for_js(page, "() => document.getElementById('chart-entropy').layout.xaxis.title.text.startsWith('wall time')",
                timeout=5_000)
    assert page.evaluate("() => document.getElementById('chart-entropy').layout.yaxis.type") == "log"
    # Back to the defaults: the URL is the page's own again.
    page.select_option("#x-axis", "step")
    page.uncheck("#log-toggle")
    page.uncheck("#smooth-toggle")
    page.fill("#metric-search", "")
    assert page.url.endswith(f"/monitor/jobs/{job.pk}/")
    page.wait_for_load_state("networkidle")
    assert problems == []
