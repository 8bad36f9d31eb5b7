"""A time budget and a loss aggregation from the launch form and the API: ``max_minutes`` and ``loss_agg``
reach the trainer's config (a learning bar's "within 15 minutes", and a recipe's ``loss_agg: token-mean``);
a job that leaves them out has neither key, so the trainer's defaults apply as before the fields existed. A
pool's ``acquire_timeout`` is taken with its sizes."""

from __future__ import annotations

from typing import Any

from django.urls import reverse

from tests.webapp.factories import builtin_entries, launch_data
from webapp.jobs.forms import initial_from_job
from webapp.jobs.models import TrainingJob


def test_a_time_budget_and_a_loss_aggregation_on_the_launch_form_reach_the_trainers_config(
    alice_client: Any, team_a: Any
) -> None:
    page = alice_client.get(reverse("jobs:launch")).content.decode()
    assert 'name="max_minutes"' in page and 'name="loss_agg"' in page and 'value="token-mean"' in page
    tool, reward = builtin_entries()
    response = alice_client.post(
        reverse("jobs:launch"), launch_data(team_a, tool, reward, max_minutes=15, loss_agg="token-mean")
    )
    assert response.status_code == 302, response.context["form"].errors
    job = TrainingJob.objects.get()
    assert (job.config["max_minutes"], job.config["algorithm"]["loss_agg"]) == (15, "token-mean")
    assert (initial_from_job(job)["max_minutes"], initial_from_job(job)["loss_agg"]) == (15, "token-mean")


def test_a_launch_without_them_leaves_the_trainers_defaults(alice_client: Any, team_a: Any) -> None:
    tool, reward = builtin_entries()
    response = alice_client.post(reverse("jobs:launch"), launch_data(team_a, tool, reward))
    assert response.status_code == 302, response.context["form"].errors
    config = TrainingJob.objects.get().config
    assert "max_minutes" not in config and "loss_agg" not in config["algorithm"]


def test_the_api_takes_them_and_refuses_a_budget_below_six_seconds_and_an_unknown_aggregation(
    alice_api: Any, team_a: Any
) -> None:
    tool, reward = builtin_entries()
    base = {"name": "x", "team": "team-a", "tools": [tool.pk], "reward": reward.pk}
    response = alice_api.post("/api/jobs/", {**base, "max_minutes": 0.05}, format="json")
    assert response.status_code == 400
    assert "max_minutes=0.05 must be between 0.1 and 10080" in str(response.json()["max_minutes"])
    response = alice_api.post("/api/jobs/", {**base, "loss_agg": "seq-sum"}, format="json")
    assert response.status_code == 400
    assert "algorithm.loss_agg: 'seq-sum' is not one of" in str(response.json()["loss_agg"])
    response = alice_api.post("/api/jobs/", {**base, "max_minutes": 1.5, "loss_agg": "token-mean"}, format="json")
    assert response.status_code == 201, response.content
    config = response.json()["config"]
    assert (config["max_minutes"], config["algorithm"]["loss_agg"]) == (1.5, "token-mean")


def test_a_pool_smaller_than_the_rollouts_in_flight_may_wait_longer_for_an_instance(
    alice_api: Any, team_a: Any
) -> None:
    tool, reward = builtin_entries()
    response = alice_api.post("/api/jobs/", {"name": "x", "team": "team-a", "tools": [tool.pk], "reward": reward.pk,
                                             "resources": {"python": {"max": 2, "acquire_timeout": 300}}},
                              format="json")
    assert response.status_code == 201, response.content
    assert response.json()["config"]["resources"] == {"python": {"max": 2, "acquire_timeout": 300}}
