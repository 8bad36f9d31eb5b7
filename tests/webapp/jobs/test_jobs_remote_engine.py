"""Remote inference servers from the launch form and the API: a team picks among the servers the operator
allows it (``AGENTFLY_INFERENCE_SERVERS``), and its job's trainer config says ``engine: remote`` with them;
a server the team was not given is refused on the field, naming the ones it may use."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from tests.webapp.factories import builtin_entries, launch_data
from webapp.jobs.models import TrainingJob

SERVERS = {"*": ["http://gpu1:8000"], "team-a": ["http://gpu2:8000/"], "team-b": ["http://gpu3:8000"]}


@pytest.fixture(autouse=True)
def inference_servers(settings: Any) -> None:
    settings.AGENTFLY_INFERENCE_SERVERS = SERVERS


def test_servers_the_team_may_use_make_the_job_roll_out_on_the_remote_engine(alice_client: Any, team_a: Any) -> None:
    assert 'name="engine_servers"' in alice_client.get(reverse("jobs:launch")).content.decode()
    tool, reward = builtin_entries()
    response = alice_client.post(reverse("jobs:launch"), launch_data(
        team_a, tool, reward, engine_servers="http://gpu1:8000, http://gpu2:8000"))
    assert response.status_code == 302, response.context["form"].errors
    config = TrainingJob.objects.get().config
    assert (config["engine"], config["engine_servers"]) == ("remote", ["http://gpu1:8000", "http://gpu2:8000"])


def test_a_server_given_to_another_team_is_refused_on_the_field_naming_the_allowed_ones(
    alice_client: Any, team_a: Any
) -> None:
    tool, reward = builtin_entries()
    response = alice_client.post(reverse("jobs:launch"), launch_data(team_a, tool, reward,
                                                                     engine_servers="http://gpu3:8000"))
    assert response.status_code == 400
    errors = response.context["form"].errors["engine_servers"]
    assert "http://gpu3:8000 is not a server team 'team-a' may use" in errors[0]
    assert "http://gpu1:8000" in errors[0] and "http://gpu2:8000" in errors[0]
    assert not TrainingJob.objects.exists()


def test_the_api_takes_a_list_of_servers_and_a_launch_without_them_keeps_the_in_process_engine(
    alice_api: Any, team_a: Any
) -> None:
    tool, reward = builtin_entries()
    base = {"name": "x", "team": "team-a", "tools": [tool.pk], "reward": reward.pk}
    response = alice_api.post("/api/jobs/", {**base, "engine_servers": ["http://evil:9000"]}, format="json")
    assert response.status_code == 400 and "may use" in str(response.json()["engine_servers"])
    response = alice_api.post("/api/jobs/", {**base, "engine_servers": ["http://gpu2:8000"]}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["config"]["engine_servers"] == ["http://gpu2:8000"]
    response = alice_api.post("/api/jobs/", {**base, "name": "y"}, format="json")
    assert response.status_code == 201 and "engine" not in response.json()["config"]


def test_the_worker_refuses_inference_servers_the_operator_has_since_removed(
    alice_api: Any, team_a: Any, settings: Any
) -> None:
    from webapp.jobs.servers import ServerRefused
    from webapp.jobs.tasks import config_to_run

    tool, reward = builtin_entries()
    response = alice_api.post("/api/jobs/", {"name": "x", "team": "team-a", "tools": [tool.pk], "reward": reward.pk,
                                             "engine_servers": ["http://gpu2:8000"]}, format="json")
    assert response.status_code == 201, response.content
    job = TrainingJob.objects.get()
    assert config_to_run(job)["engine_servers"] == ["http://gpu2:8000"]
    settings.AGENTFLY_INFERENCE_SERVERS = {"*": ["http://gpu1:8000"]}
    with pytest.raises(ServerRefused, match="no longer allowed: http://gpu2:8000 is not a server team 'team-a' may "
                                            "use; allowed: http://gpu1:8000"):
        config_to_run(job)
