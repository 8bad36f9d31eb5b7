"""The dashboard's charts as a TensorBoard or W&B user reads them: held-out evaluations drawn against step,
one chart per unit; a metric with one point (an evaluation only at the end) a summary card, never a line
chart; log scale with smoothing sane on rates that touch 0 and on all-zero series; no SI prefixes on a
loss; a job's name drawn as text in the compare page's legend, never as a link.

Jobs are stored rows with events in the trainer's payload shapes; Daphne serves, Debian's Chromium reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import watch_for_problems
from tests.webapp.helpers import Daphne, off_loop, sign_in, wait_for_js
from trainer.events import metrics_event

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "charts"
DRAWN = "() => document.body.dataset.history === 'drawn'"
EVIL = '<a href="https://evil.example/">click me</a>'


def make_job(alice: Any, name: str, events: list[dict[str, Any]], status: str = "running") -> Any:
    from webapp.accounts.models import Team
    from webapp.jobs.models import TrainingJob
    from webapp.monitor.events import append_events

    job = TrainingJob.objects.create(team=Team.objects.of(alice).get(), created_by=alice, name=name, status=status,
                                     config={"steps": 30})
    append_events(job.pk, events)
    return job


def training(steps: int) -> list[dict[str, Any]]:
    """A tool-error rate that is 0 every other step, a tiny policy loss, a retry rate always 0 (a metric of its
    own chart under "More metrics")."""
    return [metrics_event(s, {
        "reward/mean": 0.3 + s / 100, "tool_errors/mean": 0.0 if s % 2 else 0.2, "loss/policy": 3e-9 * (s % 5 - 2),
        "retries/mean": 0.0, "grad_norm": 2e-7 * s}) for s in range(1, steps + 1)]


def evaluation(step: int, accuracy: float) -> dict[str, Any]:
    return metrics_event(step, {
        "eval/accuracy": accuracy, "eval/pass@4": min(1.0, accuracy + 0.1), "eval/reward/mean": accuracy,
        "eval/reward/std": 0.2, "eval/response_length/mean": 40.0 + step, "eval/turns/mean": 2.5,
        "eval/tool_calls/mean": 1.5, "eval/finish/answer": 0.9, "time/eval": 3.0})


def charts(page: Any) -> dict[str, Any]:
    return page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('.js-plotly-plot')].map((p) => [p.id, {
        y: p.layout.yaxis.title.text, y2: p.layout.yaxis2 ? p.layout.yaxis2.title.text : null, type: p.layout.yaxis.type,
        exp: p.layout.yaxis.exponentformat,
        lines: p.data.filter((t) => t.meta === 'raw').map((t) => ({name: t.name, x: Array.from(t.x)})),
        smoothed: p.data.filter((t) => t.meta !== 'raw' && t.name && t.name.endsWith('(smoothed)')).map((t) => t.visible)}]))""")


def test_periodic_evaluations_are_curves_against_step_one_chart_per_unit(
        alice: Any, daphne: Daphne, browser_page: Any) -> None:
    job = off_loop(make_job, alice, "periodic evaluation",
                   training(30) + [evaluation(s, a) for s, a in ((10, 0.4), (20, 0.6), (30, 0.8))])
    page = browser_page
    problems = watch_for_problems(page, daphne.url)
    sign_in(page, alice, daphne.url)
    page.goto(f"{daphne.url}/monitor/jobs/{job.pk}/")
    page.wait_for_function(DRAWN, timeout=30_000)
    wait_for_js(page, "() => document.getElementById('chart-eval_counts').layout", timeout=10_000)
    drawn = charts(page)
    shares, tokens, counts = drawn["chart-eval"], drawn["chart-eval_tokens"], drawn["chart-eval_counts"]
    assert {line["name"] for line in shares["lines"]} == {"accuracy", "pass_4", "reward_mean", "finish_answer"}
    assert all(line["x"] == [10, 20, 30] for line in shares["lines"] + tokens["lines"] + counts["lines"])
    assert [line["name"] for line in tokens["lines"]] == ["response_length_mean"] and "tokens" in tokens["y"]
    assert {line["name"] for line in counts["lines"]} == {"turns_mean", "tool_calls_mean"}
    assert shares["y2"] is None and "0–1" in shares["y"]  # no second axis: nothing of another unit on it
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.locator("#chart-eval").screenshot(path=str(ARTIFACTS / "evaluation-curve.png"))
    page.wait_for_load_state("networkidle")
    assert problems == [] and page.errors == []


def test_an_evaluation_run_only_at_the_end_is_a_summary_card_not_a_one_point_chart(
        alice: Any, daphne: Daphne, browser_page: Any) -> None:
    events = [*training(20), evaluation(20, 0.75), metrics_event(20, {"time/train": 321.0})]
    job = off_loop(make_job, alice, "final evaluation", events, "succeeded")
    page = browser_page
    sign_in(page, alice, daphne.url)
    page.goto(f"{daphne.url}/monitor/jobs/{job.pk}/")
    page.wait_for_function(DRAWN, timeout=30_000)
    page.wait_for_timeout(500)
    card = page.locator(".chart.summary", has=page.locator("h3", has_text="Evaluation (held-out)"))
    assert card.is_visible()
    text = card.inner_text()
    assert "accuracy" in text and "0.7500" in text and "step 20" in text
    assert not page.locator("#chart-eval").is_visible()
    assert page.evaluate("() => !document.getElementById('chart-eval').data")  # never drawn as a line chart
    page.screenshot(path=str(ARTIFACTS / "final-evaluation-card.png"), full_page=True)


def test_log_scale_with_smoothing_keeps_rates_that_touch_zero_and_all_zero_series_sane(
        alice: Any, daphne: Daphne, browser_page: Any) -> None:
    job = off_loop(make_job, alice, "rates with zeros", training(30))
    page = browser_page
    sign_in(page, alice, daphne.url)
    page.goto(f"{daphne.url}/monitor/jobs/{job.pk}/")
    page.wait_for_function(DRAWN, timeout=30_000)
    page.click("#more-metrics summary")
    page.check("#smooth-toggle")
    page.check("#log-toggle")
    wait_for_js(page, "() => document.getElementById('chart-tool_errors').layout.yaxis.type === 'log'", timeout=10_000)
    wait_for_js(page, "() => document.getElementById('chart-x-retries_mean').layout", timeout=10_000)
    drawn = charts(page)
    assert drawn["chart-tool_errors"]["smoothed"] == [False]  # no EMA decaying to 1e-20 on the log axis
    assert drawn["chart-reward"]["smoothed"] == [True]  # a positive series is still smoothed
    lowest = page.evaluate("() => document.getElementById('chart-tool_errors')._fullLayout.yaxis.range[0]")
    assert lowest > -3, f"the log axis reaches 1e{lowest:.0f}"
    assert drawn["chart-x-retries_mean"]["type"] == "linear"  # all zero: never an empty 10–100 log axis
    assert drawn["chart-loss"]["exp"] == "e" and drawn["chart-x-grad_norm"]["exp"] == "e"
    ticks = page.evaluate("() => [...document.querySelectorAll('#chart-loss .ytick text')].map((t) => t.textContent)")
    assert ticks and not [t for t in ticks if t[-1:] in "munpfµ"], ticks  # no SI prefixes on a loss


def test_a_job_name_with_markup_is_text_in_the_compare_legend_and_never_a_link(
        alice: Any, daphne: Daphne, browser_page: Any) -> None:
    a = off_loop(make_job, alice, EVIL, training(10))
    b = off_loop(make_job, alice, "<b>bold</b> plain", training(10))
    page = browser_page
    problems = watch_for_problems(page, daphne.url)
    sign_in(page, alice, daphne.url)
    page.goto(f"{daphne.url}/monitor/compare/?jobs={a.pk},{b.pk}")
    page.wait_for_function(DRAWN, timeout=30_000)
    wait_for_js(page, "() => document.querySelector('#chart-reward .legendtext')", timeout=10_000)
    links = page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot a')].map((a) => a.getAttribute('href'))")
    assert not [h for h in links if h and "evil" in h], links
    legend = page.evaluate("() => [...document.querySelectorAll('#chart-reward .legendtext')].map((t) => t.textContent)")
    assert any(EVIL in t for t in legend) and any("<b>bold</b>" in t for t in legend), legend
    page.wait_for_load_state("networkidle")
    assert problems == [] and page.errors == []
