"""A gateway job's page: the endpoint and job key its trainer announced, shown to its team while it runs."""

from __future__ import annotations

from typing import Any

from trainer.events import log_event
from webapp.jobs.models import Status, TrainingJob
from webapp.monitor.events import append_events

ENDPOINT = {"url": "http://10.0.0.7:41234/v1", "job_key": "afj-secret-of-the-job"}


def gateway_job(team: Any, user: Any) -> TrainingJob:
    job = TrainingJob.objects.create(team=team, created_by=user, name="my agent", status=Status.RUNNING,
                                     config={"gateway": {"enabled": True}})
    # The event as the trainer sends it when its gateway starts, stored through the worker's checks.
    append_events(job.pk, [log_event(0, f"gateway serving the policy at {ENDPOINT['url']}", gateway=ENDPOINT)])
    return job


def test_a_running_gateway_jobs_page_shows_its_endpoint_and_key_to_its_team_only(alice, team_a, alice_client,
                                                                                bob_client):
    job = gateway_job(team_a, alice)
    page = alice_client.get(job.get_absolute_url()).content.decode()
    assert f'id="gateway-url">{ENDPOINT["url"]}<' in page
    assert f'id="gateway-job-key">{ENDPOINT["job_key"]}<' in page
    assert bob_client.get(job.get_absolute_url()).status_code == 404


def test_once_a_gateway_job_ends_its_page_says_the_keys_are_revoked_and_shows_none(alice, team_a, alice_client):
    job = gateway_job(team_a, alice)
    TrainingJob.objects.filter(pk=job.pk).update(status=Status.SUCCEEDED)
    page = alice_client.get(job.get_absolute_url()).content.decode()
    assert 'id="gateway-ended"' in page and ENDPOINT["job_key"] not in page.split('id="gateway"')[1].split("</section>")[0]


def test_a_gateway_job_that_has_not_started_its_gateway_says_where_the_endpoint_will_appear(alice, team_a,
                                                                                           alice_client):
    job = TrainingJob.objects.create(team=team_a, created_by=alice, name="queued", status=Status.QUEUED,
                                     config={"gateway": {"enabled": True}})
    page = alice_client.get(job.get_absolute_url()).content.decode()
    assert 'id="gateway-waiting"' in page and 'id="gateway-url"' not in page
