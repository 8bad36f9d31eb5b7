"""A job's task from a source, from the launch form and the API: reasoning-gym and TextWorld with their options
(each bad option refused on the options field, naming it), a Task of the team's plugin folder, and never a
module the registry's rules do not allow; a clone reopens the source and its options."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.cache import cache
from django.urls import reverse

from tests.webapp.factories import builtin_entries, launch_data
from webapp.jobs.forms import initial_from_job
from webapp.jobs.models import TrainingJob


@pytest.fixture
def entries(db: None) -> tuple[Any, Any]:
    return builtin_entries()


def launch(api: Any, entries: tuple[Any, Any], **fields: Any) -> Any:
    cache.clear()  # the launch throttle counts in the cache
    tool, reward = entries
    return api.post("/api/jobs/", {"name": "source", "team": "team-a", "tools": [tool.pk], "reward": reward.pk,
                                   "task": "source", **fields}, format="json")


def test_a_reasoning_gym_job_from_the_api_stores_the_dataset_and_its_options(
        alice_api: Any, team_a: Any, entries: tuple[Any, Any]) -> None:
    response = launch(alice_api, entries, task_source="reasoning_gym:basic_arithmetic", task_options={"max_terms": 3})
    assert response.status_code == 201, response.content
    data = response.json()["config"]["data"]
    assert (data["task"], data["options"]) == ("reasoning_gym:basic_arithmetic", {"max_terms": 3})
    initial = initial_from_job(TrainingJob.objects.get())
    assert (initial["task"], initial["task_source"], initial["task_options"]) == (
        "source", "reasoning_gym:basic_arithmetic", '{"max_terms": 3}')


@pytest.mark.parametrize(("fields", "field", "words"), [
    ({"task_source": "reasoning_gym:basic_arithmetic", "task_options": {"max_term": 3}}, "task_options",
     "has no option 'max_term'"),
    ({"task_source": "textworld:custom", "task_options": {"rooms": [4, 2]}}, "task_options", "low <= high"),
    ({"task_source": "reasoning_gym:nonesuch"}, "task_source", "reasoning-gym has no dataset 'nonesuch'"),
    ({"task_source": "runs/tasks.jsonl"}, "task_source", "Write reasoning_gym:<dataset>"),
    ({"task_source": "os:system"}, "task_source", "not registrable code"),
    ({"task_source": "agentfly_teams.team_b.tasks:numbers"}, "task_source", "not in your team's plugin folder"),
])
def test_a_bad_source_or_option_is_refused_on_its_field_naming_what_to_fix(
        alice_api: Any, team_a: Any, entries: tuple[Any, Any], fields: dict[str, Any], field: str, words: str) -> None:
    response = launch(alice_api, entries, **fields)
    assert response.status_code == 400, response.content
    assert words in " ".join(e["message"] for e in response.json()[field]), response.json()
    assert not TrainingJob.objects.exists()


def test_the_launch_form_takes_a_textworld_source_and_a_task_of_the_team_s_plugin_folder(
        alice_client: Any, team_a: Any, entries: tuple[Any, Any], settings: Any, tmp_path: Path) -> None:
    page = alice_client.get(reverse("jobs:launch")).content.decode()
    assert 'name="task_source"' in page and 'name="task_options"' in page and 'value="source"' in page
    response = alice_client.post(reverse("jobs:launch"), launch_data(
        team_a, *entries, task="source", task_source="textworld:custom", task_options='{"rooms": [1, 2]}'))
    assert response.status_code == 302, response.context["form"].errors
    assert TrainingJob.objects.get().config["data"]["options"] == {"rooms": [1, 2]}
    settings.AGENTFLY_PLUGIN_DIRS = [tmp_path]
    (tmp_path / "team-a").mkdir()
    (tmp_path / "team-a" / "my_tasks.py").write_text(
        "from agentfly.tasks import Task\nnumbers = Task(name='n', title='n', tools=(), reward='r:r', "
        "samples=lambda split, n, seed: [])\n")
    cache.clear()
    response = alice_client.post(reverse("jobs:launch"), launch_data(
        team_a, *entries, name="module", task="source", task_source="agentfly_teams.team_a.my_tasks:numbers"))
    assert response.status_code == 302, response.context["form"].errors
    assert TrainingJob.objects.get(name="module").config["data"]["task"] == "agentfly_teams.team_a.my_tasks:numbers"
