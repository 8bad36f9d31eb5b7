"""Experiment trackers chosen on the launch form (or in the API) reach the trainer, and a worker's run writes
them: TensorBoard's event file, read back with TensorBoard's own reader, holds the dashboard's metric names."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from tests.webapp.factories import builtin_entries, launch_data
from tests.webapp.helpers import wait_for
from webapp.jobs import paths
from webapp.jobs.models import Status, TrainingJob


def test_trackers_ticked_on_the_launch_form_are_the_trainer_configs_trackers(alice_client: Any, team_a: Any) -> None:
    page = alice_client.get(reverse("jobs:launch")).content.decode()
    assert 'type="checkbox" name="trackers" value="wandb"' in page
    tool, reward = builtin_entries()
    response = alice_client.post(reverse("jobs:launch"), launch_data(team_a, tool, reward,
                                                                     trackers=["tensorboard", "mlflow"]))
    assert response.status_code == 302, response.context["form"].errors
    assert TrainingJob.objects.get().config["trackers"] == ["tensorboard", "mlflow"]


def test_an_unknown_tracker_through_the_api_is_refused_on_its_field(alice_api: Any, team_a: Any) -> None:
    tool, reward = builtin_entries()
    response = alice_api.post("/api/jobs/", {"name": "x", "team": "team-a", "tools": [tool.pk], "reward": reward.pk,
                                             "trackers": ["neptune"]}, format="json")
    assert response.status_code == 400
    assert "neptune is not one of the available choices" in str(response.json()["trackers"])
    assert not TrainingJob.objects.exists()


@pytest.mark.slow
@pytest.mark.integration
def test_a_job_launched_with_tensorboard_writes_the_dashboards_metrics_to_its_event_file(
        alice_api: Any, builtins: dict[str, Any]) -> None:
    from tensorboard.backend.event_processing import event_accumulator

    response = alice_api.post("/api/jobs/", {
        "name": "tracked", "team": "team-a", "tools": [builtins["calculator"].pk], "reward": builtins["math_equal"].pk,
        "steps": 2, "prompts_per_step": 2, "group_size": 2, "max_turns": 2, "max_new_tokens": 12, "eval_size": 2,
        "save_every": 0, "trackers": ["tensorboard"]}, format="json")
    assert response.status_code == 201, response.content
    job_id = response.json()["id"]
    done = wait_for(lambda: (j := alice_api.get(f"/api/jobs/{job_id}/").json())["status"] in Status.values[2:] and j,
                    180, "the job to finish", 0.5)
    assert done["status"] == "succeeded", done["error"]

    events = alice_api.get(f"/api/jobs/{job_id}/events/?type=metrics&limit=5000").json()["events"]
    names = {k for e in events for k, v in e["data"].items() if v is not None}
    acc = event_accumulator.EventAccumulator(str(paths.job_dir(TrainingJob.objects.get(pk=job_id)) / "tensorboard"))
    acc.Reload()
    assert "reward/mean" in names and set(acc.Tags()["scalars"]) == names
