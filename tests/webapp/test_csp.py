"""The Content-Security-Policy: every page carries it, no template needs inline script, and a real browser
loads the main pages (the job list, the launch form, a dashboard with its websocket, the API docs) without
one violation."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.urls import reverse

from tests.webapp.helpers import PASSWORD, ROOT, Daphne
from webapp.jobs.models import TrainingJob


def directives(header: str) -> dict[str, list[str]]:
    parts = (d.strip().split() for d in header.split(";") if d.strip())
    return {p[0]: p[1:] for p in parts}


def test_every_page_carries_a_policy_that_allows_no_inline_script(alice_client: Any, team_a: Any,
                                                                  alice: Any) -> None:
    job = TrainingJob.objects.create(team=team_a, created_by=alice, name="j", config={})
    for url in [reverse("jobs:list"), reverse("jobs:launch"), reverse("monitor:dashboard", args=[job.pk]),
                reverse("registry:list"), reverse("api-docs"), reverse("login")]:
        response = alice_client.get(url)
        assert response.status_code == 200, url
        policy = directives(response["Content-Security-Policy"])
        assert policy["script-src"] == ["'self'"], (url, policy)
        assert policy["connect-src"] == ["'self'", "ws:", "wss:"]
        assert policy["object-src"] == ["'none'"] and policy["frame-ancestors"] == ["'none'"]


def test_no_template_has_an_inline_script_or_event_handler() -> None:
    offenders = []
    for template in sorted((ROOT / "templates").rglob("*.html")):
        text = template.read_text()
        for tag in re.findall(r"<script\b[^>]*>", text):
            if "src=" not in tag and 'type="application/json"' not in tag:
                offenders.append(f"{template.name}: {tag}")
        offenders += [f"{template.name}: {m}" for m in re.findall(r"\son[a-z]+\s*=", text)]
        offenders += [f"{template.name}: {m}" for m in re.findall(r"javascript:", text)]
    assert not offenders


@pytest.fixture
def watched_job(alice_for_the_server: Any, team_a: Any) -> TrainingJob:
    # Made before the browser starts: sync Playwright runs an event loop in this thread, where the ORM refuses.
    from webapp.monitor.events import append_events

    job = TrainingJob.objects.create(team=team_a, created_by=alice_for_the_server, name="watched", config={})
    # Metrics to plot, so the dashboard's Plotly charts are drawn (styles injected) under the policy.
    append_events(job.pk, [{"type": "metrics", "step": s, "reward_mean": s / 10, "loss": 1 / s} for s in (1, 2, 3)])
    return job


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
