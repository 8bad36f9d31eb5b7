"""The Content-Security-Policy in a real browser: the job list, the launch form, a dashboard (Plotly and its
websocket) and the API docs load in Debian's Chromium with no violation reported."""

from __future__ import annotations

from typing import Any

import pytest

from tests.webapp.helpers import PASSWORD, Daphne
from trainer.events import metrics_event
from webapp.jobs.models import TrainingJob


@pytest.fixture
def watched_job(alice_for_the_server: Any, team_a: Any) -> TrainingJob:
    # Made before the browser starts: sync Playwright runs an event loop in this thread, where the ORM refuses.
    from webapp.monitor.events import append_events

    job = TrainingJob.objects.create(team=team_a, created_by=alice_for_the_server, name="watched", config={})
    # Metrics to plot, so the dashboard's Plotly charts are drawn (styles injected) under the policy.
    append_events(job.pk, [metrics_event(s, {"reward_mean": s / 10, "loss": 1 / s}) for s in (1, 2, 3)])
    return job


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.integration
def test_pages_load_with_no_csp_violation(watched_job: TrainingJob, daphne: Daphne, browser_page: Any) -> None:
    from playwright.sync_api import expect

    page, web_server = browser_page, daphne.url

    job = watched_job
    violations: list[str] = []
    page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)
    # Registered through the devtools protocol, so the listener itself is no inline script.
    page.add_init_script("document.addEventListener('securitypolicyviolation', e => "
                         "console.error('Content Security Policy violation: ' + e.violatedDirective + ' ' + e.blockedURI))")
    page.set_default_timeout(30_000)
    page.goto(f"{web_server}/login/")
    page.fill("#id_username", "alice")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    expect(page.locator("h1")).to_have_text("Training jobs")
    page.goto(f"{web_server}/jobs/launch/")
    expect(page.locator("#launch-button")).to_be_visible()
    page.goto(f"{web_server}/monitor/jobs/{job.pk}/")
    expect(page.locator("#job-progress")).to_be_attached()
    expect(page.locator(".js-plotly-plot").first).to_be_attached()  # history came over the websocket, drawn
    page.wait_for_timeout(1000)
    page.goto(f"{web_server}/api/docs/")
    expect(page.locator(".swagger-ui")).to_be_visible()
    page.wait_for_timeout(1000)
    assert violations == []
