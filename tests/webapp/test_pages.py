"""The pages around the jobs: a landing page with the demo job, the app's own 404/500 pages, a favicon, a
launch form whose defaults launch, and a Cancel that asks first.

The browser tests load each page in Debian's Chromium and fail on any console error, uncaught exception,
failed request or response of 400 or more (the favicon included), besides the page's own expected status."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any

from tests.webapp.factories import builtin_entries


class FormValues(HTMLParser):
    """What a browser would submit from the first ``<form class="launch">`` untouched: inputs' values,
    checked checkboxes, selected options (or a select's first option), textareas' text."""

    def __init__(self) -> None:
        super().__init__()
        self.values: list[tuple[str, str]] = []
        self._in_form = False
        self._select: str | None = None
        self._select_first: str | None = None
        self._select_chosen = False
        self._textarea: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form" and "launch" in a.get("class", ""):
            self._in_form = True
        if not self._in_form:
            return
        if tag == "input" and a.get("name"):
            if a.get("type") in ("checkbox", "radio") and "checked" not in a:
                return
            self.values.append((a["name"], a.get("value", "")))
        elif tag == "select":
            self._select, self._select_first, self._select_chosen = a.get("name"), None, False
        elif tag == "option" and self._select:
            if self._select_first is None:
                self._select_first = a.get("value", "")
            if "selected" in a:
                self.values.append((self._select, a.get("value", "")))
                self._select_chosen = True
        elif tag == "textarea":
            self._textarea = a.get("name")
            self.values.append((a["name"], ""))

    def handle_data(self, data: str) -> None:
        if self._textarea:
            name, text = self.values[-1]
            self.values[-1] = (name, text + data.lstrip("\n"))

    def handle_endtag(self, tag: str) -> None:
        if tag == "select" and self._select:
            if not self._select_chosen and self._select_first is not None:
                self.values.append((self._select, self._select_first))
            self._select = None
        elif tag == "textarea":
            self._textarea = None
        elif tag == "form":
            self._in_form = False


def test_the_launch_forms_defaults_launch_a_job_with_the_calculator_and_math_equal(alice_client: Any) -> None:
    from webapp.jobs.models import TrainingJob

    calculator, math_equal = builtin_entries()
    html = alice_client.get("/jobs/launch/").content.decode()
    assert 'type="checkbox" name="tools"' in html  # a checkbox per tool, not a Ctrl-click list
    parser = FormValues()
    parser.feed(html)
    data: dict[str, list[str]] = {}
    for name, value in parser.values:
        data.setdefault(name, []).append(value)
    assert data["tools"] == [str(calculator.pk)] and data["reward"] == [str(math_equal.pk)]
    response = alice_client.post("/jobs/launch/", data)
    assert response.status_code == 302, response.content.decode()[:3000]
    job = TrainingJob.objects.get()
    assert response["Location"] == job.get_absolute_url()
    assert job.config["data"]["task"] == "arithmetic"
    assert job.config["rollout"]["tools"] == [calculator.import_path]


def test_a_missing_page_is_the_apps_404_with_the_favicon_and_a_way_back(alice_client: Any) -> None:
    # The browser tests' Daphne runs with DEBUG on (Django's technical 404); this client runs as production.
    response = alice_client.get("/jobs/999999/")
    html = response.content.decode()
    assert response.status_code == 404
    assert 'id="not-found"' in html and "favicon.svg" in html and 'href="/jobs/"' in html


def test_the_500_page_is_the_apps_own_and_renders_without_a_request_context(rf: Any) -> None:
    from django.views.defaults import server_error

    response = server_error(rf.get("/boom/"))
    html = response.content.decode()
    assert response.status_code == 500
    assert "Something went wrong on the server" in html and "favicon.svg" in html


# ------------------------------------------------------------------------------------------ browser tests


def test_the_demo_job_from_a_warm_start_passes_the_launch_form_with_the_demo_recipe(
        alice: Any, tmp_path: Any, settings: Any) -> None:
    from webapp.demo import launch_demo_job

    settings.AGENTFLY_ALLOWED_PATHS = [tmp_path]  # the operator's shared folder the demo's warm start sits in

    builtin_entries()
    warm = tmp_path / "warm_start"
    warm.mkdir()
    (warm / "config.json").write_text("{}")
    team = alice.groups.get().team
    job = launch_demo_job(alice, team, 60, warm, "calculator")
    cfg = job.config
    assert cfg["model"]["path"] == str(warm) and cfg["steps"] == 60
    assert cfg["optim"]["lr"] == 3e-5 and cfg["rollout"]["temperature"] == 0.7 and cfg["rollout"]["max_turns"] == 3
