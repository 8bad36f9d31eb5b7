"""Bad input is a 400 naming its field, never a 500; the OpenAPI schema is true to every response.

Against the real PostgreSQL (which is what refuses NUL and lone surrogates, and overflows on huge
integers), a real Redis and Celery control channel (the gpu-worker check), and a real Daphne server for the
schemathesis run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse

from tests.webapp.factories import builtin_entries, launch_data
from tests.webapp.helpers import ROOT, Daphne
from webapp.jobs.models import TrainingJob
from webapp.registry.models import Entry

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture
def entries(db: None) -> tuple[Any, Any]:
    return builtin_entries()


def post_json(api: Any, url: str, body: str) -> Any:
    """POST ``body`` as it is: a client that escapes a lone surrogate as ``\\ud800`` sends exactly this."""
    return api.generic("POST", url, body, content_type="application/json")


def messages_of(response: Any, field: str) -> str:
    body = response.json()
    return " ".join(m["message"] if isinstance(m, dict) else str(m) for m in body.get(field, []))


# ------------------------------------------------------------------------------------------ unstorable text
def test_a_team_name_with_a_lone_surrogate_is_a_400_naming_the_field(alice_api: Any, team_a: Any) -> None:
    response = post_json(alice_api, "/api/registry/", '{"kind": "tool", "import_path": "a:b", "team": "\\ud800"}')
    assert response.status_code == 400, response.content
    assert "lone surrogate" in messages_of(response, "team")
    response = post_json(alice_api, "/api/jobs/", '{"name": "x", "team": "\\udfff", "reward": 1}')
    assert response.status_code == 400 and "lone surrogate" in messages_of(response, "team")
    assert not Entry.objects.exists() and not TrainingJob.objects.exists()


@pytest.mark.parametrize(("body", "field"), [
    ('{"name": "a\\u0000b", "team": "team-a", "reward": 1}', "name"),
    ('{"name": "ok", "team": "team-a", "reward": 1, "resources": {"py\\u0000": {"max": 1}}}', "resources"),
    ('{"name": "ok", "team": "team-a", "reward": 1, "resources": {"\\ud83d": {}}}', "resources"),
    ('{"kind": "tool", "import_path": "a:b\\u0000", "team": "team-a"}', "import_path"),
])
def test_a_nul_or_a_surrogate_in_any_text_field_is_a_400_naming_the_field(alice_api: Any, team_a: Any,
                                                                          entries: tuple[Any, Any], body: str,
                                                                          field: str) -> None:
    url = "/api/registry/" if "import_path" in body else "/api/jobs/"
    response = post_json(alice_api, url, body)
    assert response.status_code == 400, response.content
    assert "cannot be stored" in messages_of(response, field)
    assert not TrainingJob.objects.exists()


def test_a_nul_in_a_page_form_is_refused_on_its_field(alice_client: Any, team_a: Any,
                                                      entries: tuple[Any, Any]) -> None:
    response = alice_client.post(reverse("accounts:teams"), {"name": "Vision\x00"})
    assert response.status_code == 400 and "Null characters" in " ".join(response.context["form"].errors["name"])
    response = alice_client.post(reverse("jobs:launch"),
                                 launch_data(team_a, *entries, resources='{"python\\u0000": {"max": 2}}'))
    assert response.status_code == 400
    assert "NUL character" in " ".join(response.context["form"].errors["resources"])


# ------------------------------------------------------------------------------------------ deep and large JSON
def test_json_nested_100000_deep_is_a_400(alice_api: Any, alice_client: Any, team_a: Any,
                                          entries: tuple[Any, Any]) -> None:
    for url in ("/api/jobs/", "/api/registry/", f"/api/registry/{entries[0].pk}/try/", "/api/token/"):
        response = post_json(alice_api, url, DEEP)
        assert response.status_code == 400, (url, response.content[:300])
        assert "nested too deeply" in response.json()["detail"]
    # The same JSON typed into the page forms: the launch form's resources, the "try it" arguments.
    response = alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries, resources=DEEP))
    assert response.status_code == 400
    assert "nested too deeply" in " ".join(response.context["form"].errors["resources"])
    response = alice_client.post(reverse("registry:try", args=[entries[0].pk]), {"arguments": DEEP})
    assert response.status_code == 400 and "nested too deeply" in response.content.decode()
    assert not TrainingJob.objects.exists()


def test_a_body_over_the_upload_limit_is_a_400_naming_the_setting(alice_api: Any, team_a: Any,
                                                                  settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = post_json(alice_api, "/api/jobs/", json.dumps({"name": "x" * 2000}))
    assert response.status_code == 400 and "DATA_UPLOAD_MAX_MEMORY_SIZE" in response.json()["detail"]


# ------------------------------------------------------------------------------------------ integers
HUGE = "99999999999999999999"


@pytest.mark.parametrize(("url", "field"), [
    (f"/api/jobs/?limit={HUGE}", "limit"),
    (f"/api/jobs/?offset={HUGE}", "offset"),
    ("/api/jobs/?offset=-1", "offset"),
    ("/api/registry/?limit=0", "limit"),
    (f"/api/registry/?offset={HUGE}", "offset"),
])
def test_a_limit_beyond_bigint_is_a_400(alice_api: Any, team_a: Any, url: str, field: str) -> None:
    response = alice_api.get(url)
    assert response.status_code == 400, response.content
    assert "give an integer from" in messages_of(response, field)


def test_event_positions_beyond_bigint_are_a_400(alice_api: Any, alice_client: Any, team_a: Any,
                                                 alice: Any) -> None:
    job = TrainingJob.objects.create(team=team_a, created_by=alice, name="j", config={})
    response = alice_api.get(f"/api/jobs/{job.pk}/events/?after={HUGE}")
    assert response.status_code == 400 and "after" in response.json()
    for query, word in [(f"after={HUGE}", "after"), ("after=²", "after"), (f"limit={HUGE}", "limit")]:
        response = alice_client.get(reverse("monitor:events", args=[job.pk]) + "?" + query)
        assert response.status_code == 400 and word in response.json()["error"], query
    page = alice_client.get(reverse("monitor:compare") + f"?jobs={HUGE},²")
    assert page.status_code == 200 and "is not a job id" in page.content.decode()
    assert alice_api.get(f"/api/jobs/{HUGE}/").status_code == 404
    assert alice_client.get(f"/jobs/{HUGE}/").status_code == 404


# ------------------------------------------------------------------------------------------ launch options
def test_a_jsonl_task_without_an_eval_file_is_refused_at_launch(alice_client: Any, team_a: Any,
                                                                entries: tuple[Any, Any], tmp_path: Path,
                                                                settings: Any) -> None:
    settings.AGENTFLY_ALLOWED_PATHS = [tmp_path]  # a shared data folder of this server
    task = tmp_path / "train.jsonl"
    task.write_text('{"question": "1+1", "answer": "2"}\n')
    data = launch_data(team_a, *entries, queue="gpu", task="jsonl", task_path=str(task))
    response = alice_client.post(reverse("jobs:launch"), data)
    assert response.status_code == 400
    assert "held-out samples" in " ".join(response.context["form"].errors["eval_path"])
    assert 'data-field="eval_path"' in response.content.decode()
    response = alice_client.post(reverse("jobs:launch"), {**data, "eval_path": str(tmp_path / "missing.jsonl")})
    assert "is not a file" in " ".join(response.context["form"].errors["eval_path"])
    response = alice_client.post(reverse("jobs:launch"), {**data, "eval_path": str(task)})
    assert response.status_code == 302
    assert TrainingJob.objects.get().config["data"]["eval_path"] == str(task)


def test_an_unknown_resource_name_is_refused_at_launch(alice_client: Any, alice_api: Any, team_a: Any,
                                                       entries: tuple[Any, Any]) -> None:
    response = alice_client.post(reverse("jobs:launch"),
                                 launch_data(team_a, *entries, queue="gpu", resources='{"gpu_farm": {"max": 2}}'))
    assert response.status_code == 400
    errors = " ".join(response.context["form"].errors["resources"])
    assert "Unknown resource 'gpu_farm'" in errors and "python" in errors
    response = alice_api.post("/api/jobs/", {"name": "x", "team": "team-a", "tools": [entries[0].pk],
                                             "reward": entries[1].pk, "queue": "gpu",
                                             "resources": {"nope": {"max": 1}}}, format="json")
    assert response.status_code == 400 and "Unknown resource 'nope'" in messages_of(response, "resources")
    assert not TrainingJob.objects.exists()


def test_the_gpu_queue_is_refused_when_no_gpu_worker_listens(alice_client: Any, alice_api: Any, team_a: Any,
                                                             entries: tuple[Any, Any], settings: Any) -> None:
    from webapp.jobs import queues

    settings.AGENTFLY_CHECK_GPU_WORKERS = True
    queues.forget()
    try:
        assert "gpu" not in queues.consumed_queues()  # asked of the real workers over Redis: none consumes it
        response = alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries, queue="gpu"))
        assert response.status_code == 400
        assert "No GPU worker is running" in " ".join(response.context["form"].errors["queue"])
        response = alice_api.post("/api/jobs/", {"name": "x", "team": "team-a", "tools": [entries[0].pk],
                                                 "reward": entries[1].pk, "queue": "gpu"}, format="json")
        assert response.status_code == 400 and "No GPU worker" in messages_of(response, "queue")
        assert not TrainingJob.objects.exists()
        # The cpu queue is not asked about (a job there waits visibly for its worker).
        assert alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries)).status_code == 302
    finally:
        queues.forget()


# ------------------------------------------------------------------------------------------ the schema, fuzzed
@pytest.fixture
def unconsumed_broker(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A Redis namespace of its own for the server under test: no worker listens there, so a fuzzed launch
    stays queued and "try it" answers its documented 504 after half a second; the keys go afterwards."""
    import redis
    from django.conf import settings

    prefix = f"agentfly-fuzz-{uuid.uuid4().hex[:8]}:"
    monkeypatch.setenv("AGENTFLY_REDIS_PREFIX", prefix)
    monkeypatch.setenv("AGENTFLY_TRY_TIMEOUT", "0.5")
    monkeypatch.setenv("AGENTFLY_CHECK_GPU_WORKERS", "1")
    yield prefix
    client = redis.Redis.from_url(settings.REDIS_URL)
    for key in client.scan_iter(f"{prefix}*"):
        client.delete(key)


SCHEMATHESIS_CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"


def schemathesis_command(base: str, token: str, report: Path, config: Path) -> list[str]:
    return [str(Path(sys.executable).parent / "schemathesis"), "--config-file", str(config), "run",
            f"{base}/api/schema/?format=json",
            "--checks", SCHEMATHESIS_CHECKS, "--max-examples", "15", "--seed", "1", "--workers", "1",
            "--phases", "examples,coverage,fuzzing,stateful", "--generation-deterministic",
            "--request-timeout", "10", "-H", f"Authorization: Token {token}", "--no-color",
            # "try it" waits for a worker to run the tool: without one its honest answer is a 504, a server
            # error to the run. Its input rules are tested above and in test_registry_input.py.
            "--exclude-path-regex", "/try/$",
            "--report", "json", "--report-json-path", str(report)]


@pytest.mark.slow
def test_schemathesis_finds_no_server_error_or_schema_mismatch(unconsumed_broker: str, alice: Any, team_a: Any,
                                                               entries: tuple[Any, Any], daphne: Daphne,
                                                               tmp_path: Path) -> None:
    from rest_framework.authtoken.models import Token

    token = Token.objects.create(user=alice).key
    job = TrainingJob.objects.create(team=team_a, created_by=alice, name="fuzzed", config={})
    # Path ids of real rows of alice's team, so the fuzzed requests reach the views' logic, not only a 404.
    config = tmp_path / "schemathesis.toml"
    config.write_text(f'[[operations]]\ninclude-path-regex = "^/api/jobs/"\nparameters = {{ "path.id" = {job.pk} }}\n'
                      f'[[operations]]\ninclude-path-regex = "^/api/registry/"\n'
                      f'parameters = {{ "path.id" = {entries[0].pk} }}\n')
    report = tmp_path / "schemathesis.json"
    result = subprocess.run(schemathesis_command(daphne.url, token, report, config), cwd=tmp_path, capture_output=True,
                            text=True, timeout=300, env={**os.environ, "NO_COLOR": "1"})
    (tmp_path / "schemathesis.txt").write_text(result.stdout + result.stderr)
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
    summary = json.loads(report.read_text())
    assert not summary["failures"] and not summary["errors"], summary["failures"]
    # The run really ran: every operation but "try it" tested, and over a thousand cases (1281 when written).
    assert summary["operations"]["tested"] >= 11 and summary["test_cases"]["generated"] >= 1000, summary
    print(f"schemathesis: {summary['test_cases']} over {summary['operations']['tested']} operations")


# ------------------------------------------------------------------------------------------ deployment checks
def compose_environment() -> dict[str, str]:
    """docker-compose's ``x-app`` environment as compose would resolve it with no variables set but
    SECRET_KEY and POSTGRES_PASSWORD, both required (``${NAME:-default}`` takes its default)."""
    import re

    import yaml

    env = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["x-app"]["environment"]
    secret = "compose-secret-" + "k" * 40

    def resolve(value: Any) -> str:
        text = str(value)
        text = re.sub(r"\$\{SECRET_KEY:\?[^}]*\}", secret, text)
        text = re.sub(r"\$\{POSTGRES_PASSWORD:\?[^}]*\}", "d" * 48, text)
        return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", text)

    return {k: resolve(v) for k, v in env.items()}


def test_check_deploy_is_clean_with_defaults_and_with_compose_environment(tmp_path: Path) -> None:
    base = {k: v for k, v in os.environ.items()
            if k not in {"DEBUG", "SECRET_KEY", "ALLOWED_HOSTS", "DATABASE_URL", "AGENTFLY_PLUGIN_DIRS"}}
    compose = {**compose_environment(), "AGENTFLY_RUNS_DIR": str(tmp_path / "runs")}
    for name, env in [("defaults", {"DEBUG": "0", "SECRET_KEY": "a-long-random-secret-" * 4}), ("compose", compose)]:
        result = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
                                cwd=ROOT, env={**base, **env}, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, (name, result.stdout + result.stderr)
        assert "System check identified no issues" in result.stdout, (name, result.stdout)


def test_a_nul_in_a_form_encoded_api_body_is_a_400_naming_the_field(alice_api: Any, team_a: Any) -> None:
    for data, field in [({"kind": "tool", "import_path": "a:b", "team": "team-a\x00"}, "team"),
                        ({"kind": "tool", "import_path": "a:b\x00", "team": "team-a"}, "import_path")]:
        response = alice_api.post("/api/registry/", data)  # multipart, as a browser form would send it
        assert response.status_code == 400, response.content
        assert field in response.json()
    response = alice_api.generic("POST", "/api/registry/", "kind=tool&import_path=a:b&team=team-a%00",
                                 content_type="application/x-www-form-urlencoded")
    assert response.status_code == 400 and "NUL character" in messages_of(response, "team")
