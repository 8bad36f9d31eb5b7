"""The job list's filters on both databases the app runs on (PostgreSQL, and the demo's SQLite: run this file
with ``DATABASE_URL=sqlite:///FILE`` too): a tag filter and a search by name answer with the matching jobs,
never a server error."""

from __future__ import annotations

import re
from typing import Any

from django.urls import reverse

from webapp.jobs.models import TrainingJob
from webapp.monitor.models import JobNote


def listed(client: Any, **query: str) -> list[str]:
    response = client.get(reverse("jobs:list"), query)
    assert response.status_code == 200
    return re.findall(r'<a href="/jobs/\d+/">([^<]+)</a>', response.content.decode())


def test_filtering_the_job_list_by_tag_shows_exactly_the_tagged_jobs(alice_client: Any, team_a: Any, team_b: Any,
                                                                      alice: Any) -> None:
    tagged = TrainingJob.objects.create(team=team_a, created_by=alice, name="baseline run", config={})
    other = TrainingJob.objects.create(team=team_a, created_by=alice, name="lr run", config={})
    TrainingJob.objects.create(team=team_a, created_by=alice, name="untagged", config={})
    theirs = TrainingJob.objects.create(team=team_b, name="bob's baseline", config={})
    JobNote.objects.create(job=tagged, tags=["baseline", "lr sweep"])
    JobNote.objects.create(job=other, tags=["lr sweep 2"])  # a tag that only starts like another is not it
    JobNote.objects.create(job=theirs, tags=["baseline"])
    assert listed(alice_client, tag="baseline") == ["baseline run"]
    assert listed(alice_client, tag=" LR  Sweep ") == ["baseline run"]  # typed as the tag box writes it
    assert listed(alice_client, tag="nothing") == []


def test_searching_the_job_list_by_name_ignores_case_and_combines_with_the_other_filters(
        alice_client: Any, team_a: Any, alice: Any) -> None:
    for name, status in (("calculator-grpo seed 1", "succeeded"), ("Calculator-GRPO seed 2", "failed"),
                         ("key-chain rloo", "succeeded")):
        TrainingJob.objects.create(team=team_a, created_by=alice, name=name, config={}, status=status)
    assert sorted(listed(alice_client, q="calculator")) == ["Calculator-GRPO seed 2", "calculator-grpo seed 1"]
    assert listed(alice_client, q="calculator", status="succeeded") == ["calculator-grpo seed 1"]
    page = alice_client.get(reverse("jobs:list"), {"q": "no such job"}).content.decode()
    assert "No job matches these filters." in page
