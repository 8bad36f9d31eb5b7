"""A job's own launch fields (ranks, nodes, resume_from) are columns beside its trainer config, and the
migration that made them columns moved the values older jobs kept inside their config."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE, AFTER = [("jobs", "0004_quotas_preemption")], [("jobs", "0005_launch_fields")]


@pytest.mark.django_db(transaction=True)
def test_the_migration_moves_ranks_nodes_and_resume_from_out_of_the_stored_config(team_a: Any, alice: Any) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps.get_model("jobs", "TrainingJob")
    spread = old.objects.create(team_id=team_a.pk, created_by_id=alice.pk, name="two nodes", config={
        "steps": 4, "ranks": 2, "nodes": 3, "resume_from": "/runs/team-a/job-1/checkpoint-000002"}).pk
    plain = old.objects.create(team_id=team_a.pk, created_by_id=alice.pk, name="plain", config={"steps": 4}).pk

    executor = MigrationExecutor(connection)
    executor.migrate(AFTER)
    new = executor.loader.project_state(AFTER).apps.get_model("jobs", "TrainingJob")
    moved = new.objects.get(pk=spread)
    assert moved.config == {"steps": 4}
    assert (moved.ranks, moved.nodes, moved.resume_from) == (2, 3, "/runs/team-a/job-1/checkpoint-000002")
    untouched = new.objects.get(pk=plain)
    assert untouched.config == {"steps": 4} and (untouched.ranks, untouched.nodes, untouched.resume_from) == (1, 1, "")

    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)  # and back: the values return to the config
    back = executor.loader.project_state(BEFORE).apps.get_model("jobs", "TrainingJob").objects.get(pk=spread)
    assert back.config == {"steps": 4, "ranks": 2, "nodes": 3, "resume_from": "/runs/team-a/job-1/checkpoint-000002"}
    MigrationExecutor(connection).migrate(AFTER)


@pytest.mark.django_db
def test_the_api_shows_the_launch_fields_in_the_config_as_before_and_stores_them_as_columns(
        team_a: Any, alice: Any) -> None:
    from webapp.jobs.api import JobSerializer
    from webapp.jobs.models import TrainingJob

    job = TrainingJob.objects.create(team=team_a, created_by=alice, name="x", config={"steps": 2}, ranks=2,
                                     resume_from="/runs/team-a/job-1/checkpoint-000001")
    assert JobSerializer(job).data["config"] == {"steps": 2, "ranks": 2,
                                                 "resume_from": "/runs/team-a/job-1/checkpoint-000001"}
    assert TrainingJob.objects.get(pk=job.pk).config == {"steps": 2}
