"""Asynchronous rollouts from the launch form and the API: ``rollout_mode`` and ``max_staleness`` are checked
and reach the trainer's config as ``rollout.mode`` / ``rollout.max_staleness``; a job that leaves them out is
the sync job it was before the fields existed."""

from __future__ import annotations

from typing import Any

from django.urls import reverse

from tests.webapp.factories import builtin_entries, launch_data
from webapp.jobs.models import TrainingJob


def test_async_chosen_on_the_launch_form_is_the_trainer_configs_rollout_mode(
    alice_client: Any, team_a: Any
) -> None:
    page = alice_client.get(reverse("jobs:launch")).content.decode()
    assert 'name="rollout_mode"' in page and 'value="async"' in page and 'name="max_staleness"' in page
    tool, reward = builtin_entries()
    response = alice_client.post(
        reverse("jobs:launch"), launch_data(team_a, tool, reward, rollout_mode="async", max_staleness=2)
    )
    assert response.status_code == 302, response.context["form"].errors
    rollout = TrainingJob.objects.get().config["rollout"]
    assert (rollout["mode"], rollout["max_staleness"]) == ("async", 2)


def test_a_launch_without_the_fields_stays_a_sync_job(alice_client: Any, team_a: Any) -> None:
    tool, reward = builtin_entries()
    response = alice_client.post(reverse("jobs:launch"), launch_data(team_a, tool, reward))
    assert response.status_code == 302, response.context["form"].errors
    rollout = TrainingJob.objects.get().config["rollout"]
    assert (rollout["mode"], rollout["max_staleness"]) == ("sync", 1)  # the trainer's defaults


def test_the_api_refuses_a_staleness_below_1_and_an_unknown_mode_on_their_fields(
    alice_api: Any, team_a: Any
) -> None:
    tool, reward = builtin_entries()
    base = {"name": "x", "team": "team-a", "tools": [tool.pk], "reward": reward.pk}
    response = alice_api.post(
        "/api/jobs/", {**base, "rollout_mode": "async", "max_staleness": 0}, format="json"
    )
    assert response.status_code == 400
    assert "rollout.max_staleness=0 must be >= 1 (the producer" in str(response.json()["max_staleness"])
    response = alice_api.post("/api/jobs/", {**base, "rollout_mode": "later"}, format="json")
    assert response.status_code == 400
    assert "rollout.mode: 'later' is not one of" in str(response.json()["rollout_mode"])
    response = alice_api.post(
        "/api/jobs/", {**base, "rollout_mode": "async", "max_staleness": 1}, format="json"
    )
    assert response.status_code == 201, response.content
    assert response.json()["config"]["rollout"]["mode"] == "async"
    assert TrainingJob.objects.count() == 1
