"""Failures no one can miss, in a real browser: a team's reward that raises on every call, trained on a real
Celery worker and watched through Daphne, fails the job after ``rollout.max_reward_error_steps`` steps (3 by
default) with the reward's traceback and the fix, and the job page and dashboard show a banner with the first
traceback, at a laptop's size and a phone's. Before, such a job ended "Succeeded" with reward 0 throughout."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.conftest import watch_for_problems
from tests.webapp.helpers import ROOT, Daphne, off_loop, sign_in, wait_for, wait_for_js

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

ARTIFACTS = ROOT / "test-artifacts" / "failures"
SIZES = {"laptop": {"width": 1440, "height": 900}, "phone": {"width": 390, "height": 844}}


def register_and_wait(api: Any, kind: str, import_path: str) -> dict[str, Any]:
    entry = api.post("/api/registry/", {"kind": kind, "import_path": import_path, "team": "team-a"},
                     format="json").json()
    return wait_for(lambda: (e := api.get(f"/api/registry/{entry['id']}/").json())["status"] != "pending" and e,
                    60, f"the worker to inspect {import_path}")


@pytest.mark.timeout(600)
def test_a_job_whose_reward_always_raises_fails_with_its_traceback_and_both_pages_show_the_banner(
        alice: Any, alice_api: Any, builtins: dict[str, Any], daphne: Daphne, browser_page: Any) -> None:
    from webapp.jobs.models import Status, TrainingJob

    reward = off_loop(register_and_wait, alice_api, "reward", "team_tools:lookup_answer")
    assert reward["status"] == "ready", reward["error"]
    response = off_loop(lambda: alice_api.post("/api/jobs/", {
        "name": "broken reward", "team": "team-a", "tools": [builtins["calculator"].pk], "reward": reward["id"],
        "steps": 20, "prompts_per_step": 1, "group_size": 2, "max_turns": 1, "max_new_tokens": 4, "eval_size": 1,
        "save_every": 1}, format="json"))
    assert response.status_code == 201, response.content
    job_id = response.json()["id"]
    job = off_loop(wait_for, lambda: TrainingJob.objects.filter(pk=job_id, status__in=["succeeded", "failed",
                                                                                      "cancelled"]).first(),
                   300, "the job to end")
    assert job.status == Status.FAILED, (job.status, job.error)
    assert job.step == 3, job.error  # the default rollout.max_reward_error_steps
    assert "reward 'lookup_answer' raised KeyError: 'start'" in job.error
    assert "Fix the reward" in job.error and "in lookup_answer" in job.error

    page = browser_page
    sign_in(page, alice, daphne.url)
    problems = watch_for_problems(page, daphne.url)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for size, viewport in SIZES.items():
        page.set_viewport_size(viewport)
        for where, path in (("job", f"/jobs/{job_id}/"), ("dashboard", f"/monitor/jobs/{job_id}/")):
            page.goto(f"{daphne.url}{path}")
            if where == "dashboard":
                wait_for_js(page, "() => document.body.dataset.history === 'drawn'", timeout=30_000)
            banner = page.locator("#reward-errors")
            assert banner.is_visible(), (size, where)
            text = banner.inner_text()
            assert "The reward raises." in text and "At step 3, 100% of the rollouts' rewards raised" in text, text
            assert "KeyError: 'start'" in page.inner_text("#reward-errors-traceback")
            assert 'table["start"]' in page.inner_text("#reward-errors-traceback")  # the line that raised
            page.screenshot(path=str(ARTIFACTS / f"{size}-{where}-reward-errors.png"), full_page=True)
        # The errors chart draws the share of raised rewards.
        assert page.evaluate("() => Number(document.getElementById('chart-tool_errors').dataset.points)") >= 3
    assert problems == []
