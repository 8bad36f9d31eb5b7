"""The launch form and API refuse bad input on the field, before anything is queued; permissions; CSRF."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from tests.webapp.factories import builtin_entries, launch_data, ready_entry
from webapp.jobs.models import Checkpoint, Status, TrainingJob


@pytest.fixture
def entries(db: None) -> tuple[Any, Any]:
    return builtin_entries()


BAD_FORM_INPUT = [
    ("name", "", "This field is required."),
    ("name", "   ", "This field is required."),
    ("name", "x" * 101, "at most 100 characters"),
    ("team", "", "This field is required."),
    ("team", "999999", "Select a valid choice"),
    ("model_source", "huggingface", "Select a valid choice"),
    ("model_path", "", None),  # with model_source=path below
    ("task", "webshop", "Select a valid choice"),
    ("task_size", "0", "data.train_size=0 must be between 1 and 1000000"),
    ("task_size", "many", "Enter a whole number."),
    ("tools", ["999999"], "Select a valid choice"),
    ("reward", "", "This field is required."),
    ("reward", "999999", "Select a valid choice"),
    ("algorithm", "dpo", "algorithm.name: 'dpo' is not one of 'grpo'"),
    ("steps", "0", "steps=0 must be between 1 and 100000"),
    ("steps", "100001", "steps=100001 must be between 1 and 100000"),
    ("steps", "1.5", "Enter a whole number."),
    ("prompts_per_step", "0", "rollout.prompts_per_step=0 must be between 1 and 1024"),
    ("group_size", "1", "grpo compares responses to the same prompt, so it needs rollout.group_size >= 2"),
    ("group_size", "65", "rollout.group_size=65 must be between 1 and 64"),
    ("max_turns", "0", "rollout.max_turns=0 must be between 1 and 32"),
    ("parser", "json", "rollout.parser: 'json' is not one of"),
    ("max_new_tokens", "0", "rollout.max_new_tokens=0 must be between 1 and 32768"),
    ("learning_rate", "0", "optim.lr=0.0 must be > 0 and <= 1"),
    ("learning_rate", "2", "optim.lr=2.0 must be > 0 and <= 1"),
    ("learning_rate", "fast", "Enter a number."),
    ("temperature", "0", "rollout.temperature=0.0 must be > 0 and <= 5"),
    ("seed", "-1", "seed=-1 must be between 0 and 2147483647"),
    ("eval_size", "0", "data.eval_size=0 must be between 1 and 100000"),
    ("save_every", "-1", "save_every=-1 must be between 0 and 100000"),
    ("resources", "{python: 4}", "Not valid JSON"),
    ("resources", "[1]", "Write an object of resource names"),
    ("resources", '{"python": 4}', "write its pool as an object"),
    ("resources", '{"python": {"max": 0}}', "resources.python.max=0 must be >= 1"),
    ("resources", '{"python": {"min": 3, "max": 2}}', "resources.python: min=3 is above max=2"),
    ("resources", '{"python": {"size": 2}}', "unknown keys"),
    ("resources", '{"python": {"max": "four"}}', "resources.python.max: expected an integer or null, got 'four'"),
    ("resources", '{"python": {"max": 2000}}', "resources.python.max=2000 is above what a job of this web app may"),
    ("resources", '{"python": {"max": 4, "acquire_timeout": 0}}', "resources.python.acquire_timeout=0.0 must be > 0"),
    ("resources", '{"python": {"acquire_timeout": "soon"}}', "resources.python.acquire_timeout: expected a number"),
    ("resources", '{"python": {"acquire_timeout": 7200}}', "acquire_timeout=7200 is above what a job of this web"),
    ("queue", "tpu", "Select a valid choice"),
    ("launch_key", "k" * 65, "at most 64 characters"),
]


@pytest.mark.parametrize(("field", "value", "message"), BAD_FORM_INPUT)
def test_bad_launch_input_is_refused_on_its_field_and_nothing_is_queued(
        alice_client: Any, team_a: Any, entries: tuple[Any, Any], field: str, value: Any, message: str | None) -> None:
    data = launch_data(team_a, *entries, **{field: value})
    if field == "model_path":
        data["model_source"] = "path"
        message = "Give the model directory"
    response = alice_client.post(reverse("jobs:launch"), data)
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert message in " ".join(errors.get(field, [])), errors
    assert f'data-field="{field}"' in response.content.decode()  # shown in place, next to the field
    assert not TrainingJob.objects.exists()


def test_a_model_path_must_be_a_saved_model_directory(alice_client: Any, team_a: Any, entries: tuple[Any, Any],
                                                      tmp_path: Any, settings: Any) -> None:
    settings.AGENTFLY_ALLOWED_PATHS = [tmp_path]  # what is outside is refused before anything is looked at
    for path, message in [(tmp_path / "missing", "is not a directory"), (tmp_path, "has no config.json")]:
        response = alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries, model_source="path",
                                                                          model_path=str(path)))
        assert message in " ".join(response.context["form"].errors["model_path"])
    (tmp_path / "notes.txt").write_text("x")
    for path, message in [("", "Give the JSONL file"), (tmp_path / "nope.jsonl", "is not a file"),
                          (tmp_path / "notes.txt", "must be JSON lines")]:
        response = alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries, task="jsonl",
                                                                          task_path=str(path)))
        assert message in " ".join(response.context["form"].errors["task_path"])
    assert not TrainingJob.objects.exists()


def test_paths_outside_the_allowed_folders_are_refused(alice_client: Any, team_a: Any, entries: tuple[Any, Any],
                                                      tmp_path: Any, settings: Any) -> None:
    settings.AGENTFLY_ALLOWED_PATHS = [tmp_path / "models"]
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "models" / "m" / "config.json").write_text("{}")
    escape = str(tmp_path / "models" / ".." / "elsewhere")
    for path in ("/etc", escape):
        response = alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries, model_source="path",
                                                                          model_path=path))
        assert "is outside the folders this server allows" in " ".join(response.context["form"].errors["model_path"])
    response = alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries, model_source="path",
                                                                      model_path=str(tmp_path / "models" / "m"),
                                                                      queue="gpu"))
    assert response.status_code == 302


def test_the_form_s_action_format_reaches_the_job_and_hermes_is_what_an_omitted_one_means(
        alice_client: Any, team_a: Any, entries: tuple[Any, Any]) -> None:
    assert alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries, parser="command")).status_code == 302
    assert alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries, name="b")).status_code == 302
    assert [j.config["rollout"].get("parser", "hermes") for j in TrainingJob.objects.order_by("pk")] == ["command",
                                                                                                     "hermes"]
    assert "Action format" in alice_client.get(reverse("jobs:launch")).content.decode()


def test_a_sandboxed_tool_launches_with_the_pool_the_trainer_will_give_it(
        alice_client: Any, team_a: Any, entries: tuple[Any, Any]) -> None:
    # The trainer builds a pool for every resource its tools declare (trainer.loop.build_resources), so the
    # form accepts a sandboxed tool and passes the pool sizes through.
    python_code = ready_entry(None, "tool", "agentfly.tools.builtin.python_code:python_code", "python_code")
    python_code.current_version.resource = "python"
    python_code.current_version.save()
    response = alice_client.post(reverse("jobs:launch"), launch_data(
        team_a, python_code, entries[1], queue="gpu", resources='{"python": {"max": 2}}'))
    assert response.status_code == 302, response.context["form"].errors
    job = TrainingJob.objects.get()
    assert response["Location"] == job.get_absolute_url()
    assert job.config["rollout"]["tools"] == ["agentfly.tools.builtin.python_code:python_code"]
    assert job.config["resources"] == {"python": {"max": 2}}


def test_another_teams_tool_cannot_be_chosen(alice_client: Any, team_a: Any, team_b: Any,
                                             entries: tuple[Any, Any]) -> None:
    foreign = ready_entry(team_b, "tool", "team_tools:word_count", "word_count")
    response = alice_client.post(reverse("jobs:launch"), launch_data(team_a, foreign, entries[1]))
    assert "Select a valid choice" in " ".join(response.context["form"].errors["tools"])
    assert not TrainingJob.objects.exists()


BAD_API_INPUT = [
    ({"steps": 0}, "steps"),
    ({"steps": "ten"}, "steps"),
    ({"group_size": 100}, "group_size"),
    ({"learning_rate": -1}, "learning_rate"),
    ({"team": "team-b"}, "team"),
    ({"team": "nobody"}, "team"),
    ({"tools": "calculator"}, "tools"),
    ({"tools": [999999]}, "tools"),
    ({"reward": None}, "reward"),
    ({"resources": "big"}, "resources"),
    ({"resources": {"python": {"max": -1}}}, "resources"),
    ({"queue": "tpu"}, "queue"),
    ({"algorithm": "dpo"}, "algorithm"),
    ({"name": ""}, "name"),
    ({"surprise": 1}, "surprise"),
    ({"model_source": "hub"}, "model_source"),
    ({"model_source": "path", "model_path": "/no/such/model"}, "model_path"),
    ({"task": "webshop"}, "task"),
    ({"task": "jsonl", "task_path": ""}, "task_path"),
    ({"task_size": 0}, "task_size"),
    ({"prompts_per_step": 0}, "prompts_per_step"),
    ({"max_turns": 33}, "max_turns"),
    ({"max_new_tokens": -5}, "max_new_tokens"),
    ({"temperature": 0}, "temperature"),
    ({"seed": -1}, "seed"),
    ({"eval_size": 0}, "eval_size"),
    ({"save_every": -1}, "save_every"),
    ({"launch_key": "k" * 65}, "launch_key"),
]


@pytest.mark.parametrize(("change", "field"), BAD_API_INPUT)
def test_bad_launch_input_through_the_api_names_the_field(alice_api: Any, team_a: Any, team_b: Any,
                                                          entries: tuple[Any, Any], change: dict[str, Any],
                                                          field: str) -> None:
    tool, reward = entries
    payload = {"name": "api job", "team": "team-a", "tools": [tool.pk], "reward": reward.pk, "queue": "gpu", **change}
    response = alice_api.post("/api/jobs/", payload, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()
    assert not TrainingJob.objects.exists()


def test_launching_twice_with_one_key_creates_one_job(alice_client: Any, alice_api: Any, team_a: Any,
                                                      entries: tuple[Any, Any]) -> None:
    data = launch_data(team_a, *entries, queue="gpu", launch_key="k-123")
    first = alice_client.post(reverse("jobs:launch"), data)
    second = alice_client.post(reverse("jobs:launch"), data)
    assert first.status_code == second.status_code == 302 and first["Location"] == second["Location"]
    payload = {"name": "api", "team": "team-a", "tools": [entries[0].pk], "reward": entries[1].pk, "queue": "gpu"}
    a = alice_api.post("/api/jobs/", payload, format="json", HTTP_IDEMPOTENCY_KEY="api-1")
    b = alice_api.post("/api/jobs/", payload, format="json", HTTP_IDEMPOTENCY_KEY="api-1")
    assert (a.status_code, b.status_code) == (201, 200) and a.json()["id"] == b.json()["id"]
    assert TrainingJob.objects.count() == 2


def test_a_launched_job_records_its_config_and_the_versions_it_chose(alice_api: Any, team_a: Any,
                                                                     entries: tuple[Any, Any]) -> None:
    tool, reward = entries
    job = alice_api.post("/api/jobs/", {"name": "api", "team": "team-a", "tools": [tool.pk], "reward": reward.pk,
                                        "queue": "gpu", "steps": 7, "resources": {"python": {"max": 2}}},
                         format="json").json()
    assert job["status"] == "queued" and job["total_steps"] == 7
    assert job["config"]["rollout"]["tools"] == ["agentfly.tools.builtin.calculator:calculator"]
    assert job["config"]["resources"] == {"python": {"max": 2}}
    assert job["tool_versions"] == [tool.current_version.source_hash]
    events = alice_api.get(f"/api/jobs/{job['id']}/events/").json()["events"]
    assert [(e["seq"], e["type"], e["data"]["state"]) for e in events] == [(1, "status", "queued")]


def test_cancelling_a_queued_job_ends_it_and_repeating_the_cancel_changes_nothing(
        alice_client: Any, team_a: Any, entries: tuple[Any, Any]) -> None:
    alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries, queue="gpu"))
    job = TrainingJob.objects.get()
    for _ in range(2):
        response = alice_client.post(reverse("jobs:cancel", args=[job.pk]))
        assert response.status_code == 302
        job.refresh_from_db()
        assert job.status == Status.CANCELLED
    assert list(job.events.values_list("data__state", flat=True)) == ["queued", "cancelled"]


def test_a_job_without_a_checkpoint_cannot_be_resumed(alice_api: Any, team_a: Any, alice: Any) -> None:
    job = TrainingJob.objects.create(team=team_a, created_by=alice, name="x", config={}, status=Status.FAILED)
    response = alice_api.post(f"/api/jobs/{job.pk}/resume/")
    assert response.status_code == 409 and "no checkpoint" in response.json()["detail"]
    running = TrainingJob.objects.create(team=team_a, created_by=alice, name="y", config={}, status=Status.RUNNING)
    assert "only failed or cancelled" in alice_api.post(f"/api/jobs/{running.pk}/resume/").json()["detail"]


def test_event_query_parameters_are_checked(alice_api: Any, team_a: Any, alice: Any) -> None:
    job = TrainingJob.objects.create(team=team_a, created_by=alice, name="x", config={})
    for query, field in [("after=-1", "after"), ("after=x", "after"), ("limit=0", "limit"), ("type=gossip", "type")]:
        response = alice_api.get(f"/api/jobs/{job.pk}/events/?{query}")
        assert response.status_code == 400 and field in response.json()


# ------------------------------------------------------------------------------------------ permissions
@pytest.fixture
def bobs_job(bob: Any, team_b: Any) -> TrainingJob:
    job = TrainingJob.objects.create(team=team_b, created_by=bob, name="bob's secret run", config={"steps": 1},
                                     status=Status.FAILED)
    Checkpoint.objects.create(job=job, step=1, path="/tmp/bob/checkpoint-000001")
    return job


def test_a_user_of_team_a_can_neither_see_nor_act_on_team_bs_jobs(alice_client: Any, alice_api: Any,
                                                                  bobs_job: TrainingJob) -> None:
    assert "bob&#x27;s secret run" not in alice_client.get(reverse("jobs:list")).content.decode()
    for name in ("detail",):
        assert alice_client.get(reverse(f"jobs:{name}", args=[bobs_job.pk])).status_code == 404
    for name in ("cancel", "resume"):
        assert alice_client.post(reverse(f"jobs:{name}", args=[bobs_job.pk])).status_code == 404
    assert alice_api.get("/api/jobs/").json()["results"] == []
    for suffix in ("", "events/", "checkpoints/"):
        assert alice_api.get(f"/api/jobs/{bobs_job.pk}/{suffix}").status_code == 404
    for suffix in ("cancel/", "resume/"):
        assert alice_api.post(f"/api/jobs/{bobs_job.pk}/{suffix}").status_code == 404
    assert TrainingJob.objects.count() == 1  # no resume happened


def test_team_scoped_staff_see_only_their_teams_rows_in_the_admin(alice: Any, bobs_job: TrainingJob,
                                                                  team_a: Any) -> None:
    from django.contrib.auth.models import Permission

    alice.is_staff = True
    alice.save()
    alice.user_permissions.add(*Permission.objects.filter(content_type__app_label__in=["jobs", "registry", "monitor"]))
    mine = TrainingJob.objects.create(team=team_a, created_by=alice, name="alice's run", config={})
    client = Client()
    client.force_login(alice)
    listing = client.get("/admin/jobs/trainingjob/").content.decode()
    assert "alice&#x27;s run" in listing and "secret run" not in listing
    assert client.get(f"/admin/jobs/trainingjob/{bobs_job.pk}/change/").status_code == 302  # "does not exist"
    assert client.get(f"/admin/jobs/trainingjob/{mine.pk}/change/").status_code == 200
    assert "checkpoint-000001" not in client.get("/admin/jobs/checkpoint/").content.decode()
    assert client.post(f"/admin/jobs/trainingjob/{bobs_job.pk}/delete/", {"post": "yes"}).status_code == 302
    assert TrainingJob.objects.filter(pk=bobs_job.pk).exists()


def test_the_api_needs_a_token_or_a_session(client: Any, alice: Any) -> None:
    assert client.get("/api/jobs/").status_code == 401
    from rest_framework.authtoken.models import Token

    token = client.post("/api/token/", {"username": "alice", "password": "correct horse battery staple"}).json()
    assert token["token"] == Token.objects.get(user=alice).key
    assert client.get("/api/jobs/", HTTP_AUTHORIZATION=f"Token {token['token']}").status_code == 200
    assert client.get("/api/jobs/", HTTP_AUTHORIZATION="Token not-a-token").status_code == 401


def test_forms_and_session_api_calls_are_csrf_protected(alice: Any, team_a: Any, entries: tuple[Any, Any]) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    assert client.post(reverse("jobs:launch"), launch_data(team_a, *entries)).status_code == 403
    assert client.post("/api/jobs/", json.dumps({"name": "x"}), content_type="application/json").status_code == 403
    page = client.get(reverse("jobs:launch"))
    token = page.cookies["csrftoken"].value
    ok = client.post(reverse("jobs:launch"), launch_data(team_a, *entries, queue="gpu"), HTTP_X_CSRFTOKEN=token)
    assert ok.status_code == 302
    assert TrainingJob.objects.count() == 1


def test_the_openapi_schema_describes_the_launch_endpoint(alice_client: Any) -> None:
    response = alice_client.get("/api/schema/?format=json")
    assert response.status_code == 200
    schema = response.json()
    assert "/api/jobs/" in schema["paths"] and "/api/jobs/{id}/cancel/" in schema["paths"]
    assert "Launch" in json.dumps(schema["components"]["schemas"])
    docs = alice_client.get("/api/docs/").content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/" in docs and "cdn" not in docs.lower()


def test_the_job_list_refreshes_itself_while_a_job_is_active(alice_client: Any, team_a: Any, alice: Any) -> None:
    job = TrainingJob.objects.create(team=team_a, created_by=alice, name="live", config={}, status=Status.RUNNING)
    page = alice_client.get(reverse("jobs:list")).content.decode()
    assert 'hx-trigger="every 3s"' in page
    partial = alice_client.get(reverse("jobs:list"), HTTP_HX_REQUEST="true").content.decode()
    assert "<html" not in partial and 'id="job-table-card"' in partial and "live" in partial
    TrainingJob.objects.filter(pk=job.pk).update(status=Status.SUCCEEDED)
    assert 'hx-trigger="every 3s"' not in alice_client.get(reverse("jobs:list")).content.decode()


def test_the_launch_page_says_why_no_reward_can_be_chosen(alice_client: Any) -> None:
    page = alice_client.get(reverse("jobs:launch")).content.decode()
    assert "No reward is registered yet" in page


def test_a_job_nobody_takes_says_which_queue_needs_a_worker(alice_client: Any, team_a: Any, alice: Any) -> None:
    from datetime import timedelta

    from django.utils import timezone

    job = TrainingJob.objects.create(team=team_a, created_by=alice, name="stuck", config={}, queue="gpu")
    assert 'id="job-waiting"' not in alice_client.get(reverse("jobs:detail", args=[job.pk])).content.decode()
    TrainingJob.objects.filter(pk=job.pk).update(created_at=timezone.now() - timedelta(minutes=2))
    page = alice_client.get(reverse("jobs:detail", args=[job.pk])).content.decode()
    assert 'id="job-waiting"' in page and "celery -A webapp worker -Q gpu" in page


def test_a_queued_job_behind_a_busy_worker_says_its_place_and_why_and_blames_no_missing_worker(
        alice_client: Any, team_a: Any, team_b: Any, alice: Any, settings: Any) -> None:
    from datetime import timedelta

    from django.utils import timezone

    settings.AGENTFLY_TIME_SLICE = 600
    long_ago = timezone.now() - timedelta(minutes=5)
    TrainingJob.objects.create(team=team_b, name="busy", config={}, queue="gpu", status=Status.RUNNING)
    first = TrainingJob.objects.create(team=team_a, created_by=alice, name="first", config={}, queue="gpu",
                                       queued_at=long_ago)
    second = TrainingJob.objects.create(team=team_a, created_by=alice, name="second", config={}, queue="gpu",
                                        queued_at=long_ago + timedelta(seconds=1))
    page = alice_client.get(reverse("jobs:detail", args=[second.pk])).content.decode()
    assert 'id="job-waiting"' not in page and "celery -A webapp worker" not in page
    assert "place 2 of 2 on the <code>gpu</code> queue" in page
    assert "a busy worker: 1 job (#" in page and "fair share: another team" in page
    assert "1 job queued before it" in page
    first.refresh_from_db()
    assert first.queue_wait().place == 1  # type: ignore[union-attr]


# ------------------------------------------------------------------------------------------ the trainer's rules
def test_the_launch_form_offers_exactly_the_trainers_algorithms(alice: Any) -> None:
    from trainer.config import ALGORITHMS
    from webapp.jobs.forms import LaunchForm

    assert [value for value, _ in LaunchForm(user=alice).fields["algorithm"].choices] == list(ALGORITHMS)


def test_each_trainer_key_the_form_maps_is_one_it_fills_from_that_field(alice: Any, team_a: Any,
                                                                        entries: tuple[Any, Any]) -> None:
    from webapp.jobs.forms import FIELD_OF_KEY, LaunchForm, field_of

    judge = ready_entry(None, "reward", "agentfly.rewards.builtin.judge:rubric_judge", "rubric_judge")
    judge.current_version.resource = "judge"
    judge.current_version.save(update_fields=["resource"])
    form = LaunchForm(launch_data(team_a, entries[0], judge, queue="gpu", kind="sft_then_rl", judge_source="policy",
                                  judge_rubric="Right?", max_minutes=15, loss_agg="token-mean", sft_habit="no_tool",
                                  micro_batch_tokens=8192,
                                  sft_habit_phrasings="Evaluate"),
                      user=alice)  # every section, and the keys written only when set
    assert form.is_valid(), form.errors
    config = form.trainer_config()
    config["judge"]["servers"] = []  # a judge server's key, filled by its own field (tests/webapp/jobs/test_jobs_judge.py)
    for key, field in FIELD_OF_KEY.items():
        section, _, name = key.rpartition(".")
        assert name in (config[section] if section else config), key
        assert field in form.fields, key
    assert field_of("rollout.group_size") == "group_size"
    assert field_of("resources.python.max") == "resources"
    assert field_of("algorithm.minibatches") is None  # no field sets it: a form-wide error


def test_the_web_apps_jobs_send_every_trajectory_of_a_step_unless_their_config_says_otherwise(tmp_path: Path) -> None:
    from webapp.jobs.body import trainer_config

    assert trainer_config({"steps": 2}, tmp_path).log_samples == -1
    assert trainer_config({"steps": 2, "log_samples": 3}, tmp_path).log_samples == 3
