"""The Content-Security-Policy: every page carries it, no template needs inline script, and a real browser
loads the main pages (the job list, the launch form, a dashboard with its websocket, the API docs) without
one violation."""

from __future__ import annotations

import re
from typing import Any

from django.urls import reverse

from tests.webapp.helpers import ROOT
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
