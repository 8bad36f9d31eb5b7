"""A job's state is the truth everywhere: reading never writes it, a pending cancel always ends `cancelled`,
and progress tracking survives database errors (or fails the job loudly, naming the error)."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError
from django.urls import reverse
from django.utils import timezone

from trainer.events import EventStream
from webapp.jobs import worker
from webapp.jobs.body import CheckpointWatcher
from webapp.jobs.models import Checkpoint, Status, TrainingJob


@pytest.fixture
def stale_job(alice: Any, team_a: Any, settings: Any) -> TrainingJob:
    settings.JOB_HEARTBEAT_TIMEOUT = 30
    return TrainingJob.objects.create(team=team_a, created_by=alice, name="stale", config={"steps": 10},
                                      status=Status.RUNNING, step=4, worker="gpu-7:123",
                                      heartbeat_at=timezone.now() - timedelta(seconds=31))


def test_reading_jobs_leaves_a_stale_running_job_unchanged_and_shows_it_stale(
        alice_client: Any, alice_api: Any, stale_job: TrainingJob) -> None:
    before = TrainingJob.objects.filter(pk=stale_job.pk).values().get()
    listed = alice_client.get(reverse("jobs:list")).content.decode()
    detail = alice_client.get(reverse("jobs:detail", args=[stale_job.pk])).content.decode()
    api_list = alice_api.get("/api/jobs/").json()["results"]
    api_job = alice_api.get(f"/api/jobs/{stale_job.pk}/").json()
    assert TrainingJob.objects.filter(pk=stale_job.pk).values().get() == before  # not a field changed
    assert not stale_job.events.exists()  # and no status event written
    assert "no heartbeat" in listed and 'id="job-stale"' in detail and 'data-status="running"' in detail
    assert [j["status"] for j in api_list] == [api_job["status"]] == ["running"]
    assert (api_job["step"], api_job["total_steps"]) == (4, 10)


def test_the_sweep_ends_a_stale_job_with_a_pending_cancel_as_cancelled_never_failed(
        stale_job: TrainingJob) -> None:
    TrainingJob.objects.filter(pk=stale_job.pk).update(cancel_requested=True)
    Checkpoint.objects.create(job=stale_job, step=4, path="/runs/job/checkpoint-000004")
    assert worker.sweep_stale_jobs() == [stale_job.pk]
    stale_job.refresh_from_db()
    assert stale_job.status == Status.CANCELLED and stale_job.error == ""
    last = stale_job.events.order_by("-seq").first()
    assert last.data["state"] == "cancelled"
    assert "gpu-7:123 stopped sending heartbeats" in last.data["message"] and "after the cancel" in last.data["message"]
    assert "last checkpoint is step 4" in last.data["message"]


def test_a_run_that_completes_while_a_cancel_is_pending_ends_cancelled(alice: Any, team_a: Any) -> None:
    # The cancel landed during the final evaluation, after the trainer's last look at the flag.
    job = TrainingJob.objects.create(team=team_a, created_by=alice, name="finishing", config={"steps": 3},
                                     status=Status.RUNNING, step=3, cancel_requested=True)
    assert worker.finish_job(job.pk, Status.SUCCEEDED, step=3) == Status.CANCELLED
    job.refresh_from_db()
    assert job.status == Status.CANCELLED and job.step == 3
    assert job.events.order_by("-seq").first().data["state"] == "cancelled"
    # A job nobody cancelled still succeeds.
    other = TrainingJob.objects.create(team=team_a, created_by=alice, name="done", config={"steps": 3},
                                       status=Status.RUNNING)
    assert worker.finish_job(other.pk, Status.SUCCEEDED, step=3) == Status.SUCCEEDED


def test_a_database_error_in_progress_tracking_is_retried_and_tracking_goes_on(
        alice: Any, team_a: Any, caplog: pytest.LogCaptureFixture) -> None:
    job = TrainingJob.objects.create(team=team_a, created_by=alice, name="tracked", config={"steps": 5},
                                     status=Status.RUNNING)
    attempts: list[int] = []

    def record_progress(step: int) -> None:
        attempts.append(step)
        if attempts.count(2) == 1:  # the first write of step 2 meets a locked database
            raise OperationalError("database is locked")
        worker.record_progress(job.pk, step)

    watcher = CheckpointWatcher(lambda *args: None, record_progress, backoff=0.01)
    stream = EventStream([watcher])  # the trainer's own stream, which disables a sink that raises
    with caplog.at_level(logging.WARNING, logger="webapp.jobs.body"):
        for step in (1, 2, 3):
            stream.metrics(step, {"reward/mean": 0.1 * step})
            job.refresh_from_db()
            assert job.step == step  # recorded, the failed one after its retry
    assert attempts == [1, 2, 2, 3] and watcher.error is None
    assert "storing the progress of step 2 failed (attempt 1 of 5); retrying" in caplog.text


@pytest.mark.slow  # one real (tiny) training run in this process: ~40 s here
def test_a_database_error_that_persists_stops_the_run_and_fails_the_job_naming_it(
        alice_api: Any, transactional_db: None, runs_dir: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.webapp.factories import builtin_entries
    from webapp.jobs.tasks import run_job

    tool, reward = builtin_entries()
    job = alice_api.post("/api/jobs/", {"name": "untracked", "team": "team-a", "tools": [tool.pk],
                                        "reward": reward.pk, "queue": "gpu", "steps": 20, "prompts_per_step": 1,
                                        "group_size": 2, "max_turns": 1, "max_new_tokens": 8, "eval_size": 1,
                                        "save_every": 0}, format="json").json()

    def locked(job_id: int, step: int) -> None:
        raise OperationalError("database is locked")

    monkeypatch.setattr(worker, "record_progress", locked)
    monkeypatch.setattr(CheckpointWatcher, "__init__", _fast_retries(CheckpointWatcher.__init__))
    assert run_job(job["id"]) == Status.FAILED  # in this process: the task body as a worker runs it
    done = alice_api.get(f"/api/jobs/{job['id']}/").json()
    assert done["status"] == "failed"
    assert done["error"] == ("TrackingError: the progress of step 1 could not be stored after 5 attempts: "
                             "OperationalError: database is locked")
    # The run stopped instead of training on unseen, and the error was logged through the still-open sink. The
    # training process runs in a sandbox of its own, a step or two ahead of the worker that stores its
    # progress: it stops at its next step boundary after the error, far short of its 20 steps, and every step
    # it trained has its metrics stored.
    metrics = alice_api.get(f"/api/jobs/{job['id']}/events/?types=metrics").json()["events"]
    steps = sorted({e["step"] for e in metrics})
    assert steps == list(range(1, steps[-1] + 1)) and steps[-1] < 10, steps
    logs = alice_api.get(f"/api/jobs/{job['id']}/events/?types=log").json()["events"]
    assert any(e["data"]["level"] == "error" and "TrackingError" in e["data"]["message"] for e in logs)


def _fast_retries(init: Any) -> Any:
    def fast(self: CheckpointWatcher, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **{**kwargs, "backoff": 0.01})
    return fast
