"""Jobs run end to end on real Celery workers: trainer, stored events, checkpoints, cancel, crash, resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse

from tests.webapp.helpers import Worker, wait_for, worker_env
from webapp.jobs.models import Status, TrainingJob

pytestmark = pytest.mark.integration


def launch(api: Any, builtins: dict[str, Any], **fields: Any) -> dict[str, Any]:
    payload = {"name": "tiny calculator", "team": "team-a", "tools": [builtins["calculator"].pk],
               "reward": builtins["math_equal"].pk, "steps": 3, "prompts_per_step": 2, "group_size": 2,
               "max_turns": 2, "max_new_tokens": 12, "eval_size": 2, "save_every": 1, **fields}
    response = api.post("/api/jobs/", payload, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def job_in(api: Any, job_id: int, *statuses: str) -> dict[str, Any] | None:
    job = api.get(f"/api/jobs/{job_id}/").json()  # reading never writes: the beat task alone sweeps
    return job if job["status"] in statuses else None


def metrics_of(api: Any, job_id: int) -> list[dict[str, Any]]:
    return api.get(f"/api/jobs/{job_id}/events/?type=metrics&limit=5000").json()["events"]


@pytest.mark.slow
def test_a_launched_job_trains_on_a_worker_and_stores_its_events_in_order(
        alice_api: Any, alice_client: Any, builtins: dict[str, Any]) -> None:
    job = launch(alice_api, builtins)
    done = wait_for(lambda: job_in(alice_api, job["id"], *Status.values[2:]), 180, "the job to finish", 0.5)
    assert done["status"] == "succeeded", done["error"]
    assert done["step"] == 3 and "reward/mean" in done["final_metrics"]
    assert done["tool_versions"] == [builtins["calculator"].current_version.source_hash]

    events = alice_api.get(f"/api/jobs/{job['id']}/events/?limit=5000").json()["events"]
    assert [e["seq"] for e in events] == list(range(1, done["last_seq"] + 1))  # gap-free, in order
    assert {"metrics", "samples", "resources", "status", "log"} <= {e["type"] for e in events}
    states = [e["data"]["state"] for e in events if e["type"] == "status"]
    assert states[:2] == ["queued", "running"] and states[-1] == "succeeded"
    metric_steps = sorted({e["step"] for e in events if e["type"] == "metrics"})
    assert metric_steps == [1, 2, 3]
    trajectory = next(e for e in events if e["type"] == "samples")["data"]["trajectories"][0]
    assert len(trajectory["token_ids"]) == len(trajectory["loss_mask"])

    checkpoints = alice_api.get(f"/api/jobs/{job['id']}/checkpoints/").json()
    assert checkpoints[0]["step"] == 3
    # The trainer prunes old checkpoints; the job lists only those still on disk.
    assert all((Path(c["path"]) / "model.safetensors").is_file() for c in checkpoints)
    page = alice_client.get(reverse("jobs:detail", args=[job["id"]])).content.decode()
    assert 'data-status="succeeded"' in page and "checkpoint-000003" in page


@pytest.mark.slow
@pytest.mark.timeout(900)  # its waits add up to 540 s
def test_a_running_job_stops_between_steps_when_cancelled_and_resumes_once_from_its_checkpoint(
        alice_api: Any, builtins: dict[str, Any]) -> None:
    job = launch(alice_api, builtins, steps=40)
    wait_for(lambda: alice_api.get(f"/api/jobs/{job['id']}/").json()["step"] >= 2, 180, "two steps", 0.5)
    first = alice_api.post(f"/api/jobs/{job['id']}/cancel/").json()
    again = alice_api.post(f"/api/jobs/{job['id']}/cancel/").json()
    assert first["cancel_requested"] and again["cancel_requested"]
    done = wait_for(lambda: job_in(alice_api, job["id"], *Status.values[2:]), 60, "the cancel", 0.5)
    assert done["status"] == "cancelled" and done["step"] < 40
    resumed = alice_api.post(f"/api/jobs/{job['id']}/resume/")
    repeat = alice_api.post(f"/api/jobs/{job['id']}/resume/")
    assert (resumed.status_code, repeat.status_code) == (201, 200)
    assert resumed.json()["id"] == repeat.json()["id"]
    new = resumed.json()
    assert new["config"]["resume_from"].endswith(f"checkpoint-{done['step']:06d}")
    # It need not run 40 steps; it only must start right. So it is cancelled once it has trained a step past
    # the checkpoint (cancelled while still queued, "cancelled" would prove nothing about the resume).
    trained = wait_for(lambda: metrics_of(alice_api, new["id"]), 180, "the resumed job's first step", 0.5)
    assert min(e["step"] for e in trained) == done["step"] + 1  # continued from the checkpoint, not from 0
    alice_api.post(f"/api/jobs/{new['id']}/cancel/")
    ended = wait_for(lambda: job_in(alice_api, new["id"], *Status.values[2:]), 120, "the resumed job", 0.5)
    assert ended["status"] == "cancelled" and done["step"] < ended["step"] < 40


@pytest.mark.slow
@pytest.mark.timeout(900)  # two worker starts and two runs
def test_a_job_whose_worker_is_killed_fails_within_the_heartbeat_window_and_resumes(
        alice_api: Any, builtins: dict[str, Any], runs_dir: Path, tmp_path: Path, django_db_blocker: Any) -> None:
    from django.conf import settings

    env = worker_env(runs_dir)
    gpu_worker = Worker("gpu", env, tmp_path / "gpu-worker.log")
    try:
        gpu_worker.wait_ready()
        job = launch(alice_api, builtins, steps=6, queue="gpu")
        wait_for(lambda: TrainingJob.objects.get(pk=job["id"]).checkpoints.filter(step__gte=2).exists(), 180,
                 "a checkpoint at step 2", 0.3)
        gpu_worker.kill()
    finally:
        gpu_worker.stop()
    killed_at = TrainingJob.objects.get(pk=job["id"])
    assert killed_at.status == Status.RUNNING
    from webapp.jobs.tasks import fail_stale_jobs

    def swept() -> dict[str, Any] | None:  # what beat does every few seconds, on the session's cpu worker
        fail_stale_jobs.apply_async(queue="cpu")
        return job_in(alice_api, job["id"], "failed")

    failed = wait_for(swept, settings.JOB_HEARTBEAT_TIMEOUT + 10, "the dead worker to be noticed", 0.5)
    last = killed_at.checkpoints.order_by("-step").first()
    assert f"last checkpoint is step {last.step}" in failed["error"]
    assert Path(last.path, "model.safetensors").is_file()

    resumed = alice_api.post(f"/api/jobs/{job['id']}/resume/").json()
    second = Worker("gpu", env, tmp_path / "gpu-worker-2.log")
    try:
        second.wait_ready()
        done = wait_for(lambda: job_in(alice_api, resumed["id"], *Status.values[2:]), 180, "the resumed job", 0.5)
    finally:
        second.stop()
    assert done["status"] == "succeeded", done["error"]
    assert done["step"] == 6
    events = alice_api.get(f"/api/jobs/{resumed['id']}/events/?type=metrics&limit=5000").json()["events"]
    assert min(e["step"] for e in events) == last.step + 1  # continued, did not start over


def test_a_job_that_crashes_on_the_worker_ends_failed_with_the_error_shown(
        alice_api: Any, alice_client: Any, builtins: dict[str, Any], runs_dir: Path) -> None:
    broken = runs_dir / "team-a" / "broken-model"  # a job may use only its own team's runs
    broken.mkdir(parents=True, exist_ok=True)
    (broken / "config.json").write_text('{"model_type": "no-such-architecture"}')
    job = launch(alice_api, builtins, model_source="path", model_path=str(broken))
    done = wait_for(lambda: job_in(alice_api, job["id"], *Status.values[2:]), 120, "the job to fail", 0.5)
    assert done["status"] == "failed"
    assert done["error"]
    events = alice_api.get(f"/api/jobs/{job['id']}/events/?type=log").json()["events"]
    assert any(e["data"].get("level") == "error" and "Traceback" in e["data"].get("traceback", "") for e in events)
    page = alice_client.get(reverse("jobs:detail", args=[job["id"]])).content.decode()
    assert 'data-status="failed"' in page and 'id="job-error"' in page
