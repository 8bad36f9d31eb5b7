"""A real browser launches a warm start (an sft job) from the launch form and sees it succeed with its model
listed as the checkpoint. Debian's Chromium via Playwright, Daphne, the session's real Celery worker."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.webapp.helpers import ROOT, Daphne, sign_in_with_the_form

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

ARTIFACTS = ROOT / "test-artifacts"


def test_a_user_launches_an_sft_job_from_the_launch_form_and_sees_it_succeed(
        alice_for_the_server: Any, builtins: dict[str, Any], daphne: Daphne, browser_page: Any) -> None:
    from playwright.sync_api import expect

    page, web_server = browser_page, daphne.url
    ARTIFACTS.mkdir(exist_ok=True)
    page.set_default_timeout(30_000)
    sign_in_with_the_form(page, web_server, next_path="/jobs/launch/")
    expect(page.locator("h1")).to_have_text("Launch a training job")

    page.fill("#id_name", "warm start from the browser")
    page.select_option("#id_kind", "sft")
    # Only the fields a warm start uses are shown: not the RL ones, but the evaluation's generation length.
    expect(page.locator('.field[data-field="steps"]')).to_be_hidden()
    expect(page.locator("#id_max_new_tokens")).to_be_visible()
    page.fill("#id_sft_demos", "8")
    page.fill("#id_sft_epochs", "1")
    page.fill("#id_sft_batch_size", "4")
    page.fill("#id_eval_size", "2")
    page.fill("#id_max_new_tokens", "12")
    page.click("#launch-button")

    expect(page.locator("#job-kind")).to_have_text("sft")
    expect(page.locator("#job-status")).to_have_attribute("data-status", "succeeded", timeout=180_000)
    expect(page.locator("#final-metrics")).to_contain_text("eval/accuracy")
    # The warm start's model, listed as the job's checkpoint.
    expect(page.locator("td.mono.small")).to_have_text(re.compile(r"/job-\d+/sft$"))
    page.screenshot(path=str(ARTIFACTS / "webapp-sft-job.png"), full_page=True)

    page.click("#dashboard-link")
    expect(page.locator("#job-kind")).to_have_text("sft")
    expect(page.locator("#job-step")).to_have_text("step 2 / 2")
    assert not page.errors, page.errors
