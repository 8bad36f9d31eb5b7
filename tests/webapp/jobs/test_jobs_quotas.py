"""One team cannot starve another: per-team quotas refused at launch with the quota named, a job stopped at
its team's time quota, and fair share on a real one-slot Celery worker (a long job yields to another team's
short one at a checkpoint, then resumes exactly from it)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from tests.webapp.factories import builtin_entries, launch_data
from tests.webapp.helpers import Worker, wait_for, worker_env
from webapp.accounts.models import Team
from webapp.jobs import worker
from webapp.jobs.models import Status, TeamQuota, TrainingJob

FINAL = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)


@pytest.fixture
def entries(db: None) -> tuple[Any, Any]:
    return builtin_entries()


def api_launch(api: Any, entries: tuple[Any, Any], team: str = "team-a", **fields: Any) -> Any:
    tool, reward = entries
    return api.post("/api/jobs/", {"name": "quota job", "team": team, "tools": [tool.pk], "reward": reward.pk,
                                   "queue": "gpu", "steps": 3, **fields}, format="json")


def test_a_job_over_its_teams_step_quota_is_refused_at_launch_naming_the_quota(
        alice_api: Any, alice_client: Any, team_a: Any, entries: tuple[Any, Any], settings: Any) -> None:
    settings.AGENTFLY_QUOTA_MAX_STEPS = 50
    refused = api_launch(alice_api, entries, steps=51)
    assert refused.status_code == 403
    assert "quota of 50 steps per job (max_steps)" in refused.json()["detail"]
    page = alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries, steps=51))
    assert page.status_code == 400 and "max_steps" in page.content.decode()
    # The admin's row for the team overrides the server's default.
    TeamQuota.objects.create(team=team_a, max_steps=100)
    assert api_launch(alice_api, entries, steps=51).status_code == 201
    assert TrainingJob.objects.count() == 1


def test_a_team_at_its_concurrent_jobs_quota_is_refused_while_another_team_still_launches(
        alice_api: Any, bob_api: Any, team_a: Any, team_b: Any, entries: tuple[Any, Any]) -> None:
    TeamQuota.objects.create(team=team_a, concurrent_jobs=2)
    assert api_launch(alice_api, entries).status_code == 201
    assert api_launch(alice_api, entries).status_code == 201
    third = api_launch(alice_api, entries)
    assert third.status_code == 403
    assert "its quota of 2 concurrent jobs (concurrent_jobs)" in third.json()["detail"]
    assert api_launch(bob_api, entries, team="team-b").status_code == 201  # team B has its own quota
    # A finished job frees its place; a repeat of an earlier launch (its key) is never refused.
    first = TrainingJob.objects.filter(team=team_a).order_by("pk").first()
    alice_api.post(f"/api/jobs/{first.pk}/cancel/")
    assert api_launch(alice_api, entries, launch_key="k1").status_code == 201
    assert api_launch(alice_api, entries, launch_key="k1").status_code == 200


def test_team_quotas_are_the_operators_a_teams_staff_cannot_see_or_change_them(
        alice: Any, team_a: Any, client: Any) -> None:
    alice.is_staff = True
    alice.save()
    client.force_login(alice)
    assert client.get("/admin/jobs/teamquota/").status_code == 403
    assert client.post("/admin/jobs/teamquota/add/", {"team": team_a.pk, "concurrent_jobs": 99}).status_code == 403
    assert not TeamQuota.objects.exists()


# ------------------------------------------------------------------------------------ on a real worker
@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(600)
def test_a_job_past_its_teams_time_quota_stops_at_a_step_and_fails_naming_the_quota(
        alice_api: Any, builtins: dict[str, Any], team_a: Any) -> None:
    TeamQuota.objects.create(team=team_a, max_seconds=2)
    response = alice_api.post("/api/jobs/", {
        "name": "long", "team": "team-a", "tools": [builtins["calculator"].pk], "reward": builtins["math_equal"].pk,
        "steps": 500, "prompts_per_step": 1, "group_size": 2, "max_turns": 1, "max_new_tokens": 4,
        "eval_size": 1, "save_every": 1}, format="json")
    assert response.status_code == 201, response.content
    job = wait_for(lambda: TrainingJob.objects.filter(pk=response.json()["id"], status__in=FINAL).first(), 240,
                   "the job to stop", 0.5)
    assert job.status == Status.FAILED
    assert "quota of 2 s per job (max_seconds)" in job.error and job.step < 500


def test_a_job_whose_start_up_outlasts_the_slice_yields_only_after_training_a_full_slice(
        team_a: Any, team_b: Any, settings: Any) -> None:
    # Two teams' jobs whose start-up (loading a model, starting sandboxes) takes longer than the slice would
    # otherwise hand the worker back and forth at each start, neither ever training: the slice counts from
    # the run's first trained step.
    settings.AGENTFLY_TIME_SLICE = 60
    now = timezone.now()
    running = TrainingJob.objects.create(team=team_a, name="long", config={}, status=Status.RUNNING,
                                         run_started_at=now - timedelta(minutes=30))
    TrainingJob.objects.create(team=team_b, name="waiting", config={}, queued_at=now - timedelta(minutes=5))
    assert not worker.must_yield(running.pk, first_step_at=None, now=now)  # started long ago, no step yet
    assert not worker.must_yield(running.pk, first_step_at=now - timedelta(seconds=5), now=now)
    assert worker.must_yield(running.pk, first_step_at=now - timedelta(seconds=61), now=now)
    # A job of its own team waiting is no reason to yield.
    TrainingJob.objects.filter(team=team_b).update(team=team_a)
    assert not worker.must_yield(running.pk, first_step_at=now - timedelta(seconds=61), now=now)


def test_a_cancel_that_lands_while_a_job_yields_ends_it_cancelled_with_its_checkpoint(team_a: Any) -> None:
    # The yield and the cancel stop the same run: the trainer stopped for the yield (its last look at the
    # cancel flag came before the click), saved its checkpoint, and the worker then puts it back in its queue.
    # The cancel is what the user asked for: the run ends cancelled, resumable from that checkpoint, never
    # "failed, no checkpoint to resume from".
    job = TrainingJob.objects.create(team=team_a, name="long", config={"steps": 100}, status=Status.RUNNING,
                                     run_started_at=timezone.now(), step=68, cancel_requested=True)
    job.checkpoints.create(step=68, path="/runs/team-a/job/checkpoint-68")
    enqueued: list[TrainingJob] = []
    ends_as = worker.preempt_job(job.pk, 68, enqueued.append)
    assert ends_as == Status.CANCELLED and not enqueued
    assert worker.finish_job(job.pk, ends_as) == Status.CANCELLED
    job.refresh_from_db()
    assert (job.status, job.error) == (Status.CANCELLED, "") and job.can_resume
    assert job.last_checkpoint is not None and job.last_checkpoint.step == 68


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(600)
def test_on_one_worker_slot_another_teams_short_job_starts_within_a_slice_and_the_long_one_resumes_exactly(
        alice_api: Any, bob_api: Any, alice_client: Any, builtins: dict[str, Any], runs_dir: Path,
        tmp_path: Path) -> None:
    slice_s = 10
    env = {**worker_env(runs_dir), "AGENTFLY_TIME_SLICE": str(slice_s)}
    one_slot = Worker("gpu", env, tmp_path / "one-slot-worker.log")  # -c 1: one job at a time
    payload = {"tools": [builtins["calculator"].pk], "reward": builtins["math_equal"].pk, "prompts_per_step": 1,
               "group_size": 2, "max_turns": 1, "max_new_tokens": 4, "eval_size": 1, "save_every": 1,
               "queue": "gpu"}
    try:
        one_slot.wait_ready()
        # Long enough (steps of a fraction of a second) to outlast the slice and the short job by far: it is
        # cancelled once it has resumed and trained on.
        long = alice_api.post("/api/jobs/", {**payload, "name": "long", "team": "team-a", "steps": 1000},
                              format="json").json()
        wait_for(lambda: TrainingJob.objects.filter(pk=long["id"], step__gte=1).exists(), 180, "the long job's step")
        short = bob_api.post("/api/jobs/", {**payload, "name": "short", "team": "team-b", "steps": 2},
                             format="json").json()
        started = wait_for(lambda: TrainingJob.objects.filter(pk=short["id"], started_at__isnull=False).first(),
                           3 * slice_s + 120, "the short job to start")
        preempted = TrainingJob.objects.get(pk=long["id"])
        assert preempted.status == Status.PREEMPTED and preempted.step < 1000
        page = alice_client.get(reverse("jobs:detail", args=[long["id"]])).content.decode()
        assert "Preempted, queued" in page
        # Within one slice of the long job's start, plus its step in flight and the short job's start-up.
        waited = (started.started_at - started.queued_at).total_seconds()
        assert waited < slice_s + 30, waited
        wait_for(lambda: TrainingJob.objects.filter(pk=short["id"], status__in=FINAL).first(), 240,
                 "the short job to finish")
        # The long job runs again and trains on past the step it yielded at; then it is cancelled (its
        # remaining steps would only repeat what the resumed ones prove).
        wait_for(lambda: TrainingJob.objects.filter(pk=long["id"], step__gte=preempted.step + 2).first(), 300,
                 "the long job to resume and train on")
        assert alice_api.post(f"/api/jobs/{long['id']}/cancel/").status_code in (200, 202)
        done = wait_for(lambda: TrainingJob.objects.filter(pk=long["id"], status__in=FINAL).first(), 240,
                        "the long job to stop")
    finally:
        one_slot.stop()
    short_done = TrainingJob.objects.get(pk=short["id"])
    assert short_done.status == Status.SUCCEEDED and short_done.finished_at < done.finished_at
    assert done.status == Status.CANCELLED, done.error
    assert preempted.step + 2 <= done.step < 1000
    metrics = alice_api.get(f"/api/jobs/{long['id']}/events/?type=metrics&limit=5000").json()["events"]
    trained = [e["step"] for e in metrics if "reward/mean" in e["data"]]
    assert trained == list(range(1, len(trained) + 1)) and len(trained) >= done.step  # resumed exactly
    states = [e["data"]["state"] for e in alice_api.get(f"/api/jobs/{long['id']}/events/?type=status&limit=5000")
              .json()["events"]]
    assert "preempted" in states and states[-1] == "cancelled"


def test_a_member_cannot_escape_the_concurrent_jobs_quota_by_creating_a_new_team(
        alice_api: Any, alice_client: Any, bob_api: Any, team_a: Any, team_b: Any, entries: tuple[Any, Any],
        settings: Any) -> None:
    # The defaults: a team's quota and a person's are the same, so a team of one's own adds no room.
    assert settings.AGENTFLY_QUOTA_USER_CONCURRENT_JOBS == settings.AGENTFLY_QUOTA_CONCURRENT_JOBS == 4
    for _ in range(4):
        assert api_launch(alice_api, entries).status_code == 201
    assert alice_client.post(reverse("accounts:teams"), {"name": "Alice Alone"}).status_code == 302
    refused = api_launch(alice_api, entries, team="alice-alone")
    assert refused.status_code == 403, refused.content
    assert "4 per person (AGENTFLY_QUOTA_USER_CONCURRENT_JOBS)" in refused.json()["detail"]
    page = alice_client.post(reverse("jobs:launch"), launch_data(Team.objects.get(slug="alice-alone"), *entries))
    assert page.status_code == 400 and "AGENTFLY_QUOTA_USER_CONCURRENT_JOBS" in page.content.decode()
    assert api_launch(bob_api, entries, team="team-b").status_code == 201  # another person keeps their own
    # A job of hers that ends gives the place back, in whichever team she launches next.
    alice_api.post(f"/api/jobs/{TrainingJob.objects.filter(team=team_a).first().pk}/cancel/")
    assert api_launch(alice_api, entries, team="alice-alone").status_code == 201
