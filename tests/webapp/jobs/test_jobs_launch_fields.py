"""A job's own launch fields (ranks, nodes, resume_from) are columns beside its trainer config, and the
migration that made them columns moved the values older jobs kept inside their config; status events stored
before the event contract are brought to it."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE, AFTER = [("jobs", "0005_api_quota")], [("jobs", "0006_launch_fields")]


@pytest.fixture(autouse=True)
def latest_schema_after() -> Any:
    """Each test moves the schema back; the tests after it need every app's newest migration again (not just
    the one this file is about: later migrations add columns too)."""
    yield
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


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


@pytest.mark.django_db
def test_the_api_shows_the_launch_fields_in_the_config_as_before_and_stores_them_as_columns(
        team_a: Any, alice: Any) -> None:
    from webapp.jobs.models import TrainingJob
    from webapp.jobs.rest import JobSerializer

    job = TrainingJob.objects.create(team=team_a, created_by=alice, name="x", config={"steps": 2}, ranks=2,
                                     resume_from="/runs/team-a/job-1/checkpoint-000001")
    assert JobSerializer(job).data["config"] == {"steps": 2, "ranks": 2,
                                                 "resume_from": "/runs/team-a/job-1/checkpoint-000001"}
    assert TrainingJob.objects.get(pk=job.pk).config == {"steps": 2}


@pytest.mark.django_db(transaction=True)
def test_status_and_resources_events_stored_before_the_contract_are_brought_to_it(team_a: Any, alice: Any) -> None:
    before, after = [*BEFORE, ("monitor", "0003_job_note")], [*AFTER, ("monitor", "0004_event_contract")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    apps = executor.loader.project_state(before).apps
    job = apps.get_model("jobs", "TrainingJob").objects.create(team_id=team_a.pk, created_by_id=alice.pk, name="x",
                                                               config={})
    events = apps.get_model("monitor", "JobEvent").objects
    status = events.create(job_id=job.pk, seq=1, type="status", step=None, time=1.0, data={"state": "queued"})
    flat = events.create(job_id=job.pk, seq=2, type="resources", step=1, time=2.0, data={
        "cpu_percent": 12.5, "rss_mb": 300.0, "threads": 4, "memory_percent": 40.0, "engine": {"sequences": 8.0},
        "gpu": [{"index": 0, "util_percent": 90.0, "memory_used_mb": 10.0, "memory_total_mb": 40.0}]})
    sampled = events.create(job_id=job.pk, seq=3, type="resources", step=2, time=3.0, data={
        "worker": {"host": "w1", "cpu_percent": 7.0, "memory_percent": 30.0, "gpus": [], "gpu_absent": "no GPU"},
        "pools": {"python": {"in_use": 1, "waiting": 0}}})
    executor = MigrationExecutor(connection)
    executor.migrate(after)
    stored = executor.loader.project_state(after).apps.get_model("monitor", "JobEvent").objects
    assert stored.get(pk=status.pk).data == {"state": "queued", "message": ""}
    host = stored.get(pk=flat.pk).data["host"]
    assert (host["cpu_percent"], host["process_rss_mb"], host["memory_percent"], host["pid"]) == (12.5, 300.0, 40.0, None)
    assert host["gpus"] == [{"index": 0, "name": "", "util_percent": 90.0, "memory_used_mb": 10.0,
                             "memory_total_mb": 40.0, "memory_percent": 25.0}]
    assert stored.get(pk=flat.pk).data["engine"] == {"sequences": 8.0}
    typed = stored.get(pk=sampled.pk).data
    assert typed["host"]["host"] == "w1" and typed["host"]["gpu_absent"] == "no GPU"
    assert typed["pools"] == {"python": {"in_use": 1, "waiting": 0}} and typed["engine"] == {}

    from webapp.monitor.series import _resource_row

    assert _resource_row(typed) == {"host/cpu_percent": 7.0, "host/memory_percent": 30.0, "pool/python/in_use": 1,
                                    "pool/python/waiting": 0}
