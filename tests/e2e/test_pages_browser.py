"""The app's pages in a real browser: the landing page, the launch form and the job page load with no
console error, page error, failed request or response >= 400 (favicon included); Cancel asks first."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.conftest import watch_for_problems
from tests.webapp.factories import builtin_entries
from tests.webapp.helpers import Daphne, sign_in_with_the_form


@pytest.fixture
def calculator_entries(transactional_db: None) -> tuple[Any, Any]:
    """The built-in calculator and math_equal, ready (made before the browser's event loop starts)."""
    return builtin_entries()


@pytest.fixture
def demo_entries(transactional_db: None) -> None:
    """Every built-in tool and reward as a starting worker registers them (the demo's lookup and chain_answer)."""
    from webapp.registry.tasks import sync_builtins

    sync_builtins()


@pytest.fixture
def running_job(alice_for_the_server: Any, transactional_db: None) -> Any:
    from webapp.jobs.models import TrainingJob

    team = alice_for_the_server.groups.get().team
    return TrainingJob.objects.create(name="long run", team=team, created_by=alice_for_the_server,
                                      config={"steps": 100}, status="running")


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
def test_the_landing_pages_demo_button_launches_the_key_chain_demo_job_for_the_users_team(
        alice_for_the_server: Any, demo_entries: None, daphne: Daphne, browser_page: Any) -> None:
    page = browser_page
    problems = watch_for_problems(page, daphne.url)
    sign_in_with_the_form(page, daphne.url)
    page.goto(f"{daphne.url}/")
    page.click("#launch-demo")
    page.wait_for_url(lambda url: "/jobs/" in url and url.rstrip("/").split("/")[-1].isdigit())
    page.wait_for_load_state("networkidle")
    assert "demo: key-chain agent" in page.inner_text("h1")
    assert "Team A" in page.inner_text(".page-head")
    assert problems == []


@pytest.mark.slow
def test_the_launch_form_loads_cleanly_with_tools_as_checked_checkboxes(
        alice_for_the_server: Any, calculator_entries: Any, daphne: Daphne, browser_page: Any) -> None:
    page = browser_page
    sign_in_with_the_form(page, daphne.url)
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
    sign_in_with_the_form(page, daphne.url)
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
