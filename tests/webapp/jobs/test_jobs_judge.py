"""Judges from the launch form and the API: a job whose reward calls a judge (``@reward(resource="judge")``)
says where the judge runs (the job's starting model or a model directory, in the worker; or a judge server
the operator allows the team, ``AGENTFLY_JUDGE_SERVERS``) and may give it a rubric. The job stores the choice
as its trainer config's ``judge`` section; the worker checks a judge server again when it starts the job and
the trainer builds the judge pool, whose calls reach the dashboard's resources event. A reward that calls a
reward model (``resource="reward_model"``) gets a sequence-classification model directory the same way."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.urls import reverse

from tests.webapp.factories import builtin_entries, launch_data, ready_entry
from tests.webapp.helpers import wait_for
from webapp.jobs import servers
from webapp.jobs.forms import initial_from_job
from webapp.jobs.models import Status, TrainingJob
from webapp.registry.models import Kind

JUDGE_SERVERS = {"*": {"http://judge1:8000/": "/srv/models/judge"}, "team-b": {"http://judge-b:8000": "/srv/models/b"}}
RUBRIC = "Is the sum right? Grade 10 for the right number, 1 otherwise."


@pytest.fixture(autouse=True)
def judge_servers(settings: Any) -> None:
    settings.AGENTFLY_JUDGE_SERVERS = JUDGE_SERVERS


def judge_reward(team: Any = None, path: str = "agentfly.rewards.builtin.judge:rubric_judge",
                 name: str = "rubric_judge") -> Any:
    entry = ready_entry(team, Kind.REWARD, path, name)
    entry.current_version.resource = "judge"
    entry.current_version.save(update_fields=["resource"])
    return entry


def api_launch(api: Any, tool: Any, reward: Any, **fields: Any) -> Any:
    return api.post("/api/jobs/", {"name": "judged", "team": "team-a", "tools": [tool.pk], "reward": reward.pk,
                                   "queue": "gpu", **fields}, format="json")


def test_a_rubric_judge_on_a_server_the_team_may_use_is_stored_by_its_url_and_rubric(
        alice_client: Any, team_a: Any) -> None:
    page = alice_client.get(reverse("jobs:launch")).content.decode()
    assert 'name="judge_source"' in page and 'name="judge_rubric"' in page
    assert '<option value="http://judge1:8000">' in page and "judge-b" not in page  # only alice's teams' servers
    tool, _ = builtin_entries()
    response = alice_client.post(reverse("jobs:launch"), launch_data(
        team_a, tool, judge_reward(), judge_source="server", judge_server="http://judge1:8000", judge_rubric=RUBRIC))
    assert response.status_code == 302, response.context["form"].errors
    job = TrainingJob.objects.get()
    # The server's model folder is the operator's to say, when the job starts: not stored with the job.
    assert job.config["judge"] == {"backend": "remote", "servers": ["http://judge1:8000"], "rubric": RUBRIC}
    initial = initial_from_job(job)
    assert (initial["judge_source"], initial["judge_server"], initial["judge_rubric"]) == (
        "server", "http://judge1:8000", RUBRIC)


def test_a_judge_server_given_only_to_another_team_is_refused_naming_the_setting(
        alice_api: Any, team_a: Any) -> None:
    tool, _ = builtin_entries()
    reward = judge_reward()
    response = api_launch(alice_api, tool, reward, judge_source="server", judge_server="http://judge-b:8000")
    assert response.status_code == 400
    assert "AGENTFLY_JUDGE_SERVERS" in str(response.json()["judge_server"])
    assert servers.judge_refusal("http://judge-b:8000", "team-a") == (
        "http://judge-b:8000 is not a judge server team 'team-a' may use (AGENTFLY_JUDGE_SERVERS allows it: "
        "http://judge1:8000); choose one of those, or ask the operator to add it to AGENTFLY_JUDGE_SERVERS.")
    response = api_launch(alice_api, tool, reward, judge_source="server")
    assert response.status_code == 400 and "Choose the judge server" in str(response.json()["judge_server"])
    assert not TrainingJob.objects.exists()


def test_a_judge_reward_without_a_judge_and_a_judge_without_a_judge_reward_are_both_refused(
        alice_api: Any, team_a: Any) -> None:
    tool, math_equal = builtin_entries()
    response = api_launch(alice_api, tool, judge_reward())
    assert response.status_code == 400
    assert "rubric_judge calls a judge" in str(response.json()["judge_source"])
    response = api_launch(alice_api, tool, math_equal, judge_source="policy")
    assert response.status_code == 400 and "math_equal calls no judge" in str(response.json()["judge_source"])
    response = api_launch(alice_api, tool, math_equal, judge_rubric=RUBRIC)
    assert response.status_code == 400 and "A rubric is for a judge" in str(response.json()["judge_rubric"])
    assert not TrainingJob.objects.exists()


def test_a_rubric_longer_than_the_judge_reads_is_refused_naming_the_limit(alice_api: Any, team_a: Any) -> None:
    tool, _ = builtin_entries()
    response = api_launch(alice_api, tool, judge_reward(), judge_source="policy", judge_rubric="x" * 2001)
    assert response.status_code == 400
    assert "The rubric has 2001 characters; the judge reads at most 2000" in str(response.json()["judge_rubric"])


def test_a_judge_on_the_job_s_starting_model_runs_on_its_folder_and_a_model_directory_is_checked(
        alice_api: Any, team_a: Any, tmp_path: Any) -> None:
    tool, _ = builtin_entries()
    reward = judge_reward()
    response = api_launch(alice_api, tool, reward, judge_source="policy", resources={"judge": {"max": 1}})
    assert response.status_code == 201, response.content
    config = response.json()["config"]
    assert config["judge"] == {"backend": "hf", "model_dir": config["model"]["path"]}
    assert config["resources"] == {"judge": {"max": 1}}  # the reward's resource is a pool the job may size
    assert initial_from_job(TrainingJob.objects.get())["judge_source"] == "policy"
    response = api_launch(alice_api, tool, reward, name="x", judge_source="path", judge_model_path="/etc")
    assert response.status_code == 400 and "AGENTFLY_ALLOWED_PATHS" in str(response.json()["judge_model_path"])
    response = api_launch(alice_api, tool, reward, name="y", judge_source="path")
    assert response.status_code == 400 and "Give the judge model's directory" in str(response.json()["judge_model_path"])


def test_another_team_s_judge_reward_is_refused(alice_api: Any, team_a: Any, team_b: Any) -> None:
    tool, _ = builtin_entries()
    theirs = judge_reward(team_b, "agentfly_teams.team_b.judged:kind", "kind")
    response = api_launch(alice_api, tool, theirs, judge_source="policy")
    assert response.status_code == 400 and "reward" in response.json()
    assert not TrainingJob.objects.exists()


def test_the_worker_gives_an_allowed_judge_server_its_model_folder_and_refuses_one_the_operator_removed(
        alice_api: Any, team_a: Any, settings: Any) -> None:
    from webapp.jobs.tasks import config_to_run

    tool, _ = builtin_entries()
    response = api_launch(alice_api, tool, judge_reward(), judge_source="server", judge_server="http://judge1:8000")
    assert response.status_code == 201, response.content
    job = TrainingJob.objects.get()
    assert config_to_run(job)["judge"] == {"backend": "remote", "servers": ["http://judge1:8000"],
                                           "model_dir": "/srv/models/judge"}
    settings.AGENTFLY_JUDGE_SERVERS = {"team-b": JUDGE_SERVERS["team-b"]}
    with pytest.raises(servers.ServerRefused, match="no longer allowed: http://judge1:8000 is not a judge server "
                                                   r"team 'team-a' may use \(AGENTFLY_JUDGE_SERVERS"):
        config_to_run(job)


@pytest.mark.integration
def test_a_job_whose_judge_server_the_worker_does_not_allow_fails_at_start_naming_the_setting(
        alice_api: Any, builtins: dict[str, Any]) -> None:
    # The test process allows the server at launch; the session's worker has no AGENTFLY_JUDGE_SERVERS (the
    # operator took it away since), so its check at the job's start refuses it.
    assert builtins["rubric_judge"].current_version.resource == "judge"  # the registry records it
    response = api_launch(alice_api, builtins["calculator"], builtins["rubric_judge"], queue="cpu",
                          judge_source="server", judge_server="http://judge1:8000")
    assert response.status_code == 201, response.content
    job_id = response.json()["id"]
    done = wait_for(lambda: TrainingJob.objects.filter(pk=job_id, status=Status.FAILED).first(), 120,
                    "the job to fail at its start")
    assert "AGENTFLY_JUDGE_SERVERS" in done.error and "http://judge1:8000" in done.error, done.error


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_job_judged_on_its_starting_model_trains_and_reports_the_judge_s_calls(
        alice_api: Any, builtins: dict[str, Any]) -> None:
    response = api_launch(alice_api, builtins["calculator"], builtins["rubric_judge"], queue="cpu",
                          judge_source="policy", judge_rubric=RUBRIC, steps=2, prompts_per_step=2, group_size=2,
                          max_turns=1, max_new_tokens=8, eval_size=1, save_every=0)
    assert response.status_code == 201, response.content
    job_id = response.json()["id"]
    done = wait_for(lambda: TrainingJob.objects.filter(pk=job_id, status__in=Status.values[2:]).first(), 500,
                    "the judged job to finish", 0.5)
    assert done.status == Status.SUCCEEDED, done.error
    import yaml

    from webapp.jobs.paths import job_dir

    ran = yaml.safe_load((job_dir(done) / "config.yaml").read_text())  # the config the trainer ran
    assert ran["judge"]["model_dir"] == ran["model"]["path"] and ran["judge"]["rubric"] == RUBRIC
    events = alice_api.get(f"/api/jobs/{job_id}/events/?types=resources,samples&limit=5000").json()["events"]
    pools = [e["data"]["pools"] for e in events if e["type"] == "resources" and e["data"].get("pools")]
    assert pools and "judge" in pools[-1], pools
    judge = pools[-1]["judge"]
    assert judge["kind"] == "model_service"
    service = judge["service"]
    assert service["calls"] >= 1 and service["batches"] >= 1 and "latency_p50_ms" in service
    assert "parse_failures" in service and "batch_mean" in service
    graded = [t for e in events if e["type"] == "samples" for t in e["data"]["trajectories"] if t.get("final_answer")]
    # The tiny judge rarely writes a verdict: each unparsed one is a counted failure and the trajectory's error.
    unparsed = [t for t in graded if "judge's reply" in (t.get("reward_error") or "")]
    assert service["parse_failures"] >= len(unparsed)


def reward_model_dir(team: Any, architecture: str) -> str:
    from webapp.jobs.paths import team_dir

    folder = team_dir(team) / "models" / architecture
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"architectures": [architecture]}))
    return str(folder)


def test_a_reward_model_reward_gets_a_sequence_classifier_of_the_team_and_anything_else_is_refused(
        alice_api: Any, team_a: Any) -> None:
    tool, math_equal = builtin_entries()
    scored = ready_entry(None, Kind.REWARD, "agentfly.rewards.builtin.qa:exact_match", "preferred")
    scored.current_version.resource = "reward_model"
    scored.current_version.save(update_fields=["resource"])
    classifier = reward_model_dir(team_a, "Qwen2ForSequenceClassification")
    response = api_launch(alice_api, tool, scored, reward_model_path=classifier)
    assert response.status_code == 201, response.content
    assert response.json()["config"]["reward_model"] == {"model_dir": classifier}
    assert initial_from_job(TrainingJob.objects.get())["reward_model_path"] == classifier

    response = api_launch(alice_api, tool, scored, name="none")
    assert response.status_code == 400 and "preferred calls a reward model" in str(response.json()["reward_model_path"])
    response = api_launch(alice_api, tool, scored, name="lm", reward_model_path=reward_model_dir(team_a, "Qwen2ForCausalLM"))
    assert response.status_code == 400 and "not a sequence-classification model" in str(response.json()["reward_model_path"])
    response = api_launch(alice_api, tool, math_equal, name="unused", reward_model_path=classifier)
    assert response.status_code == 400 and "math_equal calls no reward model" in str(response.json()["reward_model_path"])
