"""Cancel ends `cancelled` every time, wherever it lands in a real job's life, with a consistent last checkpoint.

Real CPU jobs on the session's worker, cancelled at seven moments: while queued, once claimed but before
the first step, mid-run, right after a checkpoint was recorded, while a checkpoint is being written, during
the final evaluation, and twice in a row. After each, the list page, the detail page, the API and the
dashboard's events agree on the status and the step.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse

from tests.webapp.factories import launch_tiny_job
from tests.webapp.helpers import wait_for
from webapp.jobs.models import FINISHED, Status, TrainingJob

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = 30


def launch(api: Any, builtins: dict[str, Any], **fields: Any) -> int:
    return launch_tiny_job(api, builtins, **{"name": "cancel me", "steps": STEPS, "max_new_tokens": 8, "eval_size": 2,
                                            **fields})


def row(job_id: int) -> TrainingJob:
    return TrainingJob.objects.get(pk=job_id)


def queued(job_id: int, runs: Path) -> None:
    pass  # cancelled the moment it was launched


def claimed(job_id: int, runs: Path) -> None:
    wait_for(lambda: row(job_id).status == Status.RUNNING, 120, "the worker to claim the job", 0.05)


def mid_run(job_id: int, runs: Path) -> None:
    wait_for(lambda: row(job_id).step >= 2, 120, "two steps", 0.1)


def after_a_checkpoint(job_id: int, runs: Path) -> None:
    wait_for(lambda: row(job_id).checkpoints.filter(step__gte=2).exists(), 120, "a recorded checkpoint", 0.05)


def while_a_checkpoint_is_written(job_id: int, runs: Path) -> None:
    # The trainer writes a checkpoint into a `.partial` folder and renames it when complete.
    wait_for(lambda: any(runs.glob(f"team-a/job-{job_id}/.checkpoint-*.partial")), 120,
             "a checkpoint being written", 0.01)


def during_the_final_evaluation(job_id: int, runs: Path) -> None:
    wait_for(lambda: row(job_id).step >= 3, 120, "the last step", 0.05)


MOMENTS: list[tuple[Callable[[int, Path], None], dict[str, Any], int]] = [
    # (when to cancel, launch fields, how many cancels)
    (queued, {}, 1),
    (claimed, {}, 1),
    (mid_run, {}, 1),
    (after_a_checkpoint, {}, 1),
    (while_a_checkpoint_is_written, {}, 1),
    (during_the_final_evaluation, {"steps": 3, "eval_size": 48}, 1),
    (mid_run, {}, 2),
]


@pytest.mark.timeout(600)
def test_a_cancel_at_any_moment_ends_cancelled_with_a_consistent_last_checkpoint(
        alice_api: Any, alice_client: Any, builtins: dict[str, Any], runs_dir: Path) -> None:
    for moment, fields, cancels in MOMENTS:
        job_id = launch(alice_api, builtins, **fields)
        moment(job_id, runs_dir)
        for _ in range(cancels):
            assert alice_api.post(f"/api/jobs/{job_id}/cancel/").json()["cancel_requested"]
        wait_for(lambda j=job_id: row(j).status in FINISHED, 180, f"the cancel {moment.__name__}", 0.2)
        job = row(job_id)
        where = f"cancelled {moment.__name__}: {job.error}"
        assert job.status == Status.CANCELLED, where
        assert job.step <= job.total_steps, where

        checkpoint = job.last_checkpoint
        if moment is queued and checkpoint is None:
            assert job.step == 0, where
        else:  # the job saves when it stops, so its last checkpoint is its last step, complete on disk
            assert checkpoint is not None and checkpoint.step == job.step, where
            assert (Path(checkpoint.path) / "model.safetensors").is_file(), where
            assert not list(Path(checkpoint.path).parent.glob(".checkpoint-*.partial")), where

        # Every view tells the same story.
        api = alice_api.get(f"/api/jobs/{job_id}/").json()
        assert (api["status"], api["step"]) == ("cancelled", job.step), where
        listed = alice_client.get(reverse("jobs:list")).content.decode()
        mine = re.search(rf'<tr><td>{job_id}</td>.*?</tr>', listed, re.S)
        assert mine and 'class="badge cancelled"' in mine[0] and f"{job.step}/{job.total_steps}" in mine[0], where
        detail = alice_client.get(reverse("jobs:detail", args=[job_id])).content.decode()
        assert 'data-status="cancelled"' in detail and f"step {job.step} / {job.total_steps}" in detail, where
        states = alice_api.get(f"/api/jobs/{job_id}/events/?types=status").json()["events"]
        assert states[-1]["data"]["state"] == "cancelled", where  # what the dashboard shows last
