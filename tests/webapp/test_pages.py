"""The pages around the jobs: a landing page with the demo job, the app's own 404/500 pages, a favicon, a
launch form whose defaults launch, and a Cancel that asks first.

The browser tests load each page in Debian's Chromium and fail on any console error, uncaught exception,
failed request or response of 400 or more (the favicon included), besides the page's own expected status."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any

import pytest

from tests.webapp.factories import builtin_entries
from tests.webapp.helpers import PASSWORD, Daphne


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
def watch_for_problems(page: Any, base: str) -> list[str]:
    """Collect console errors, page errors, failed requests and error responses (other than the page's own)."""
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url} {r.failure}"))
    page.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
    return problems


@pytest.fixture
def calculator_entries(transactional_db: None) -> tuple[Any, Any]:
    """The built-in calculator and math_equal, ready (made before the browser's event loop starts)."""
    return builtin_entries()


@pytest.fixture
def running_job(alice_for_the_server: Any, transactional_db: None) -> Any:
    from webapp.jobs.models import TrainingJob

    team = alice_for_the_server.groups.get().team
    return TrainingJob.objects.create(name="long run", team=team, created_by=alice_for_the_server,
                                      config={"steps": 100}, status="running")


def sign_in(page: Any, base: str, username: str = "alice") -> None:
    page.goto(f"{base}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/login/" not in url)


@pytest.mark.slow
def test_the_landing_page_says_what_agentfly_is_and_loads_cleanly_for_a_visitor(
        daphne: Daphne, browser_page: Any) -> None:
    page = browser_page
    problems = watch_for_problems(page, daphne.url)
    page.goto(f"{daphne.url}/")
    page.wait_for_load_state("networkidle")
    assert "agentic reinforcement learning" in page.inner_text("#landing")
    assert page.locator("link[rel=icon]").get_attribute("href").endswith("favicon.svg")
    assert page.evaluate("fetch('/favicon.ico').then(r => r.ok)")  # browsers that ask anyway get the icon
    assert problems == []


@pytest.mark.slow
def test_the_landing_pages_demo_button_launches_the_calculator_job_for_the_users_team(
        alice_for_the_server: Any, calculator_entries: Any, daphne: Daphne, browser_page: Any) -> None:
    page = browser_page
    problems = watch_for_problems(page, daphne.url)
    sign_in(page, daphne.url)
    page.goto(f"{daphne.url}/")
    page.click("#launch-demo")
    page.wait_for_url(lambda url: "/jobs/" in url and url.rstrip("/").split("/")[-1].isdigit())
    page.wait_for_load_state("networkidle")
    assert "demo: calculator agent" in page.inner_text("h1")
    assert "Team A" in page.inner_text(".page-head")
    assert problems == []


@pytest.mark.slow
def test_the_launch_form_loads_cleanly_with_tools_as_checked_checkboxes(
        alice_for_the_server: Any, calculator_entries: Any, daphne: Daphne, browser_page: Any) -> None:
    page = browser_page
    sign_in(page, daphne.url)
    problems = watch_for_problems(page, daphne.url)
    page.goto(f"{daphne.url}/jobs/launch/")
    page.wait_for_load_state("networkidle")
    assert page.get_by_label("calculator (built-in)").is_checked()
    assert page.locator("#id_reward option:checked").inner_text() == "math_equal (built-in)"
    assert problems == []


@pytest.mark.slow
def test_cancel_on_the_job_page_asks_first_and_a_dismissed_question_cancels_nothing(
        running_job: Any, daphne: Daphne, browser_page: Any) -> None:
    job, page = running_job, browser_page
    sign_in(page, daphne.url)
    problems = watch_for_problems(page, daphne.url)
    page.goto(f"{daphne.url}{job.get_absolute_url()}")
    asked: list[str] = []

    def answer(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.dismiss() if len(asked) == 1 else dialog.accept()

    page.on("dialog", answer)
    page.click("#cancel-button")
    page.wait_for_timeout(500)
    assert asked and f"Cancel job #{job.pk}?" in asked[0]
    assert page.locator("#job-status").get_attribute("data-status") == "running"  # dismissed: still running
    page.click("#cancel-button")
    page.wait_for_load_state("networkidle")
    assert len(asked) == 2
    assert "Cancel" in page.inner_text(".messages")
    assert problems == []


def test_the_demo_job_from_a_warm_start_passes_the_launch_form_with_grpo_yamls_recipe(
        alice: Any, tmp_path: Any) -> None:
    from webapp.demo import launch_demo_job

    builtin_entries()
    warm = tmp_path / "warm_start"
    warm.mkdir()
    (warm / "config.json").write_text("{}")
    team = alice.groups.get().team
    job = launch_demo_job(alice, team, 60, warm)
    cfg = job.config
    assert cfg["model"]["path"] == str(warm) and cfg["steps"] == 60
    assert cfg["optim"]["lr"] == 1e-4 and cfg["rollout"]["temperature"] == 0.7 and cfg["rollout"]["max_turns"] == 3
