"""Checkpoints out in Chromium, against Daphne and the session's worker: from the job page alice downloads a
checkpoint's tar and exports it (the page says where, and lists it), at a laptop's and a phone's size; bob
gets a 404 for the download. Screenshots land in ``test-artifacts/checkpoints/``."""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import watch_for_problems
from tests.e2e.pagecheck import SIZES, layout_problems
from tests.webapp.helpers import Daphne, sign_in
from tests.webapp.jobs.test_checkpoint_exports import save_real_checkpoint, tiny_model  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "checkpoints"


@pytest.fixture
def trained_job(alice: Any, team_a: Any, runs_dir: Path, transactional_db: None, tiny_model: Path) -> Any:  # noqa: F811
    from webapp.jobs.models import TrainingJob

    job = TrainingJob.objects.create(team=team_a, created_by=alice, name="trained", status="succeeded",
                                     config={"steps": 3})
    save_real_checkpoint(job, tiny_model)
    return job


def test_a_team_downloads_and_exports_a_checkpoint_from_the_job_page_on_a_laptop_and_a_phone(
        alice: Any, bob: Any, trained_job: Any, worker: Any, daphne: Daphne, browser_page: Any,
        runs_dir: Path, tmp_path: Path) -> None:
    page = browser_page
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.set_viewport_size(SIZES["laptop"])
    sign_in(page, alice, daphne.url)
    problems = watch_for_problems(page, daphne.url)
    page.goto(f"{daphne.url}/jobs/{trained_job.pk}/")
    with page.expect_download() as download:
        page.click("#checkpoint-3 a[download]")
    saved = tmp_path / download.value.suggested_filename
    download.value.save_as(saved)
    with tarfile.open(saved) as tar:
        assert f"job-{trained_job.pk}-step-3/model.safetensors" in tar.getnames()
    page.click("#checkpoint-3 button")
    page.wait_for_selector(".msg.success")
    target = runs_dir / "team-a" / "exports" / f"job-{trained_job.pk}-step-3"
    assert str(target) in page.inner_text(".msg.success")
    assert page.inner_text("#checkpoint-3 .export-path") == str(target)
    assert (target / "model.safetensors").is_file()
    shots: dict[str, list[str]] = {}
    for size in SIZES:
        page.set_viewport_size(SIZES[size])
        page.goto(f"{daphne.url}/jobs/{trained_job.pk}/#checkpoints-out")
        page.locator("#checkpoints-out").scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / f"{size}-job.png"), full_page=True)
        shots[size] = [p for p in layout_problems(page) if "wide" in p or "tar" in p or "Export" in p]
    assert {k: v for k, v in shots.items() if v} == {}
    assert problems == []

    page.context.clear_cookies()
    sign_in(page, bob, daphne.url)
    assert page.goto(f"{daphne.url}/jobs/{trained_job.pk}/checkpoints/3.tar").status == 404
