"""A real browser walks the main path: sign in, register a tool, try it, launch a job, see it succeed.

Debian's Chromium (``apt-get install -y chromium``) driven by Playwright; the browser ``playwright install``
would download is never used. Daphne serves the app against the test database; the session's real Celery
worker runs the registry inspection and the job. Screenshots land in ``test-artifacts/``.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.webapp.helpers import PASSWORD, ROOT, Daphne

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

ARTIFACTS = ROOT / "test-artifacts"


@pytest.mark.slow
def test_a_user_signs_in_registers_a_tool_launches_a_job_and_sees_it_succeed(
        alice_for_the_server: Any, builtins: dict[str, Any], daphne: Daphne, browser_page: Any) -> None:
    # The database rows come first: sync Playwright runs an event loop in this thread, where Django's ORM
    # refuses to run, so nothing below touches the ORM.
    from playwright.sync_api import expect

    page, web_server = browser_page, daphne.url
    ARTIFACTS.mkdir(exist_ok=True)
    page.set_default_timeout(30_000)
    page.goto(f"{web_server}/jobs/")
    expect(page).to_have_url(f"{web_server}/login/?next=/jobs/")
    page.fill("#id_username", "alice")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    expect(page.locator("h1")).to_have_text("Training jobs")
    expect(page.locator(".empty")).to_contain_text("No jobs yet")

    # Register a team tool; the page polls until the worker has inspected it, then shows "try it".
    page.click("text=Registry")
    page.click("text=Register a tool or reward")
    page.fill("#id_import_path", "team_tools:word_count")
    page.click("button[type=submit]")
    expect(page.locator("#entry-status-badge")).to_have_text("Ready", timeout=60_000)
    expect(page.locator("body")).to_contain_text("word_count(text: str) -> int")
    page.fill("#id_arguments", '{"text": "three little words"}')
    page.click("text=Call the tool")
    expect(page.locator("#observation")).to_have_text("3")
    page.screenshot(path=str(ARTIFACTS / "webapp-registry.png"), full_page=True)

    # A bad number is refused in place; the corrected form launches.
    page.goto(f"{web_server}/jobs/launch/")
    page.get_by_label("calculator (built-in)").check()  # a checkbox, pre-checked by the defaults
    page.select_option("#id_reward", label="math_equal (built-in)")
    page.fill("#id_steps", "0")
    page.click("#launch-button")
    expect(page.locator('.error[data-field="steps"]')).to_contain_text("steps=0 must be between 1 and 100000")
    page.screenshot(path=str(ARTIFACTS / "webapp-launch-error.png"), full_page=True)
    page.fill("#id_steps", "2")
    page.fill("#id_eval_size", "2")
    page.fill("#id_max_new_tokens", "12")
    page.click("#launch-button")
    expect(page.locator("#job-status")).to_have_attribute("data-status", "succeeded", timeout=180_000)
    expect(page.locator("#final-metrics")).to_contain_text("reward/mean")
    expect(page.locator(".log")).to_contain_text("checkpoint saved at step 2")
    page.screenshot(path=str(ARTIFACTS / "webapp-job.png"), full_page=True)
    assert not page.errors, page.errors
