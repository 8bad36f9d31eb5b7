"""The alerts page in Chromium, served by Daphne: alice adds a webhook alert through the form, a private
address is refused in place with the setting named, and the page fits a laptop and a phone; bob does not
see alice's alert. Screenshots land in ``test-artifacts/alerts/``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import watch_for_problems
from tests.e2e.pagecheck import SIZES, layout_problems
from tests.webapp.helpers import Daphne, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "alerts"


def test_a_team_adds_a_webhook_alert_from_the_page_at_both_sizes(
        alice: Any, bob: Any, team_a: Any, daphne: Daphne, browser_page: Any) -> None:
    page = browser_page
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.set_viewport_size(SIZES["laptop"])
    sign_in(page, alice, daphne.url)
    problems = watch_for_problems(page, daphne.url)
    page.goto(f"{daphne.url}/alerts/")
    page.check("#id_on_finished")
    page.fill("#id_webhook_url", "http://10.0.0.7/hook")
    page.click("#alert-form button[type=submit]")
    assert "AGENTFLY_ALERT_ALLOWED_HOSTS" in page.inner_text('.error[data-field="webhook_url"]')
    problems[:] = [p for p in problems if "400" not in p]  # the refused form's own answer (and its console line)
    page.fill("#id_webhook_url", "https://93.184.216.34/hooks/team-a")
    page.click("#alert-form button[type=submit]")
    page.wait_for_selector(".msg.success")
    assert "failed, finished" in page.inner_text("#alert-rules")
    shots: dict[str, list[str]] = {}
    for size in SIZES:
        page.set_viewport_size(SIZES[size])
        page.goto(f"{daphne.url}/alerts/")
        page.screenshot(path=str(ARTIFACTS / f"{size}-alerts.png"), full_page=True)
        shots[size] = layout_problems(page)
    assert {k: v for k, v in shots.items() if v} == {}
    assert problems == []

    page.context.clear_cookies()
    sign_in(page, bob, daphne.url)
    page.goto(f"{daphne.url}/alerts/")
    assert "hooks/team-a" not in page.inner_text("main")
