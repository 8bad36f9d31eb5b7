"""The job page follows the training process's output in Chromium, served by Daphne: lines written while the
page is open appear within seconds, as text (markup in them is shown, never run), with the newest in view;
the card fits a laptop and a phone. Screenshots land in ``test-artifacts/output/``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import watch_for_problems
from tests.e2e.pagecheck import SIZES, layout_problems
from tests.webapp.helpers import Daphne, sign_in, wait_for_js
from webapp.jobs import paths

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "output"


@pytest.fixture
def printing_job(alice: Any, team_a: Any, runs_dir: Path, transactional_db: None) -> Any:
    from webapp.jobs.models import TrainingJob

    job = TrainingJob.objects.create(team=team_a, created_by=alice, name="printing", status="running",
                                     config={"steps": 2})
    paths.job_dir(job).mkdir(parents=True)
    (paths.job_dir(job) / "process.log").write_text("".join(f"warm-up line {i}\n" for i in range(200)))
    return job


@pytest.mark.parametrize("size", list(SIZES))
def test_the_job_page_follows_the_output_as_text_with_the_newest_line_in_view(
        size: str, alice: Any, printing_job: Any, daphne: Daphne, browser_page: Any) -> None:
    page = browser_page
    page.set_viewport_size(SIZES[size])
    sign_in(page, alice, daphne.url)
    problems = watch_for_problems(page, daphne.url)
    page.goto(f"{daphne.url}/jobs/{printing_job.pk}/")
    assert "warm-up line 199" in page.inner_text("#output-text")
    with (paths.job_dir(printing_job) / "process.log").open("a") as log:
        log.write("step 1 <img src=x onerror=alert(1)> reward 0.5\n")
    wait_for_js(page, "() => document.querySelector('#output-text').textContent.includes('step 1 <img')",
                timeout=15_000)
    assert page.locator("#output-text img").count() == 0
    at_bottom = page.evaluate("() => { const p = document.querySelector('#output-text'); "
                              "return p.scrollHeight - p.scrollTop - p.clientHeight < 2; }")
    assert at_bottom, "Follow keeps the newest line in view"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.locator("#job-output").scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / f"{size}-job.png"), full_page=True)
    assert [p for p in layout_problems(page) if "output" in p or "wide" in p] == []
    assert problems == []
