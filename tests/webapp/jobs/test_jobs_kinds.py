"""A job's kind (rl, sft, sft_then_rl) on the launch form and the API, its resume, and the dashboard's Resume
button. The runs of each kind on a real worker are in ``test_jobs_sft_run.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse

from tests.webapp.factories import builtin_entries, launch_data
from webapp.jobs.models import Checkpoint, Kind, Status, TrainingJob


@pytest.fixture
def entries(db: None) -> tuple[Any, Any]:
    return builtin_entries()


def api_payload(entries: tuple[Any, Any], **fields: Any) -> dict[str, Any]:
    tool, reward = entries
    return {"name": "api job", "team": "team-a", "tools": [tool.pk], "reward": reward.pk, "queue": "gpu", **fields}


def demonstrations(path: Path, n: int) -> Path:
    from agentfly.tasks import arithmetic

    samples = arithmetic.generate(n, seed=0, split="sft")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({**s, "messages": arithmetic.demonstration(s)}) + "\n" for s in samples))
    return path


@pytest.mark.parametrize("kind", ["rl", "sft", "sft_then_rl"])
def test_the_launch_form_queues_a_job_of_each_kind(alice_client: Any, team_a: Any, entries: tuple[Any, Any],
                                                   kind: str) -> None:
    data = launch_data(team_a, *entries, queue="gpu", kind=kind, sft_demos=20, sft_epochs=2, sft_batch_size=4)
    response = alice_client.post(reverse("jobs:launch"), data)
    assert response.status_code == 302, response.context["form"].errors
    job = TrainingJob.objects.get()
    assert job.kind == kind
    if kind == "rl":
        assert "sft" not in job.config and job.total_steps == 3
    else:  # 2 epochs of 20 demonstrations in batches of 4: 10 warm-start steps, then the 3 RL steps
        assert job.config["sft"] == {"num_demos": 20, "epochs": 2, "batch_size": 4, "lr": 2e-3,
                                     "wrong_fraction": 0.0, "demos_path": None}
        assert job.total_steps == (10 if kind == "sft" else 13)
    listing = alice_client.get(reverse("jobs:list")).content.decode()
    assert f'data-kind="{kind}"' in listing
    assert f'id="job-kind">{kind}<' in alice_client.get(job.get_absolute_url()).content.decode()


@pytest.mark.parametrize("kind", ["rl", "sft", "sft_then_rl"])
def test_the_api_launches_a_job_of_each_kind_and_reports_it(alice_api: Any, team_a: Any, entries: tuple[Any, Any],
                                                            kind: str) -> None:
    response = alice_api.post("/api/jobs/", api_payload(entries, kind=kind), format="json")
    assert response.status_code == 201, response.content
    job = response.json()
    assert job["kind"] == kind and alice_api.get(f"/api/jobs/{job['id']}/").json()["kind"] == kind
    assert ("sft" in job["config"]) == (kind != "rl")


def test_a_launch_without_a_kind_is_rl(alice_api: Any, alice_client: Any, team_a: Any,
                                       entries: tuple[Any, Any]) -> None:
    assert alice_api.post("/api/jobs/", api_payload(entries), format="json").json()["kind"] == "rl"
    assert alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries, queue="gpu")).status_code == 302
    assert set(TrainingJob.objects.values_list("kind", flat=True)) == {"rl"}


def test_an_unknown_kind_is_refused_naming_the_kinds(alice_api: Any, alice_client: Any, team_a: Any,
                                                     entries: tuple[Any, Any]) -> None:
    response = alice_api.post("/api/jobs/", api_payload(entries, kind="dpo"), format="json")
    assert response.status_code == 400
    [error] = response.json()["kind"]
    assert error["message"] == "dpo is not a kind of job; choose rl, sft or sft_then_rl."
    response = alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries, kind="pretrain"))
    assert response.status_code == 400
    assert response.context["form"].errors["kind"] == ["pretrain is not a kind of job; choose rl, sft or sft_then_rl."]
    assert 'data-field="kind"' in response.content.decode()
    assert not TrainingJob.objects.exists()


def test_a_demonstrations_file_is_counted_and_must_be_in_the_teams_folders(
        alice_client: Any, team_a: Any, team_b: Any, entries: tuple[Any, Any], runs_dir: Path, tmp_path: Path,
        settings: Any) -> None:
    settings.AGENTFLY_ALLOWED_PATHS = [tmp_path / "shared"]
    refused = {
        str(demonstrations(runs_dir / "team-b" / "demos.jsonl", 6)): "outside your team's folder",
        str(demonstrations(tmp_path / "elsewhere" / "demos.jsonl", 6)): "outside the folders this server allows",
        str(tmp_path / "shared" / "missing.jsonl"): "is not a file",
    }
    for path, message in refused.items():
        response = alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries, kind="sft", demos_path=path))
        assert response.status_code == 400
        assert message in " ".join(response.context["form"].errors["demos_path"])
    bad = tmp_path / "shared" / "bad.jsonl"
    bad.parent.mkdir()
    bad.write_text('{"question": "1+1?", "answer": "2"}\n')
    response = alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries, kind="sft", demos_path=str(bad)))
    assert 'needs a "question" and "messages"' in " ".join(response.context["form"].errors["demos_path"])
    # A JSONL task has no generated demonstrations: its warm start needs the file.
    task = demonstrations(tmp_path / "shared" / "task.jsonl", 4)
    response = alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries, kind="sft_then_rl", task="jsonl",
                                                                      task_path=str(task), eval_path=str(task)))
    assert "give a JSONL file of written ones" in " ".join(response.context["form"].errors["demos_path"])
    assert not TrainingJob.objects.exists()

    own = demonstrations(runs_dir / "team-a" / "demos.jsonl", 6)
    response = alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries, kind="sft", queue="gpu",
                                                                      demos_path=str(own), sft_demos=100))
    assert response.status_code == 302, response.context["form"].errors
    job = TrainingJob.objects.get()
    assert job.config["sft"]["demos_path"] == str(own)
    assert job.config["sft"]["num_demos"] == 6  # the file holds 6 of the 100 asked for
    assert job.total_steps == 2 * 1  # 2 epochs of one batch of 8


def test_a_demonstrations_path_written_behind_the_api_is_refused_on_the_worker(team_a: Any, runs_dir: Path) -> None:
    from webapp.jobs.paths import PathRefused, check_config

    with pytest.raises(PathRefused, match=r"sft\.demos_path"):
        check_config({"sft": {"demos_path": str(runs_dir / "team-b" / "demos.jsonl")}}, team_a)


def test_a_warm_start_runs_as_one_process(alice_client: Any, team_a: Any, entries: tuple[Any, Any],
                                         settings: Any) -> None:
    response = alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries, kind="sft", gpus=2))
    assert "A warm start (sft) runs as one process" in " ".join(response.context["form"].errors["gpus"])


@pytest.mark.parametrize("kind", ["sft", "sft_then_rl"])
def test_a_warm_start_job_runs_on_one_host(alice_client: Any, team_a: Any, entries: tuple[Any, Any],
                                           kind: str) -> None:
    response = alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries, kind=kind, nodes=2))
    assert "runs on one host; set 1 node" in " ".join(response.context["form"].errors["nodes"])
    assert not TrainingJob.objects.exists()


# ----------------------------------------------------------------------------------------------- resume
def finished_job(team: Any, user: Any, kind: str, status: str, **config: Any) -> TrainingJob:
    job = TrainingJob.objects.create(team=team, created_by=user, name="x", kind=kind, status=status,
                                     config={"steps": 5, "model": {"path": "/m", "build_tiny": True}, **config})
    Checkpoint.objects.create(job=job, step=3, path=f"/runs/job-{job.pk}/checkpoint-000003")
    return job


def test_resuming_keeps_the_kind_and_an_sft_then_rl_job_resumes_its_rl_from_the_warm_start(
        alice_api: Any, team_a: Any, alice: Any, runs_dir: Path) -> None:
    parent = finished_job(team_a, alice, Kind.SFT_THEN_RL, Status.CANCELLED, sft={"num_demos": 8})
    response = alice_api.post(f"/api/jobs/{parent.pk}/resume/")
    assert response.status_code == 201, response.content
    child = response.json()
    assert child["kind"] == "sft_then_rl"
    assert child["config"]["resume_from"].endswith("checkpoint-000003")
    warm_start = str(runs_dir / "team-a" / f"job-{parent.pk}" / "sft")
    # The warm start's safetensors, whatever the warm start itself loaded (a GGUF file is not read again).
    assert child["config"]["model"] == {"path": warm_start, "build_tiny": False, "gguf_file": None}
    # Its own resume names the same warm start (the model its config names), not a folder it never wrote.
    TrainingJob.objects.filter(pk=child["id"]).update(status=Status.FAILED)
    Checkpoint.objects.create(job_id=child["id"], step=4, path="/runs/x/checkpoint-000004")
    grandchild = alice_api.post(f"/api/jobs/{child['id']}/resume/").json()
    assert grandchild["config"]["model"]["path"] == warm_start and grandchild["kind"] == "sft_then_rl"


def test_a_warm_start_job_has_no_resume(alice_api: Any, alice_client: Any, team_a: Any, alice: Any) -> None:
    job = finished_job(team_a, alice, Kind.SFT, Status.FAILED)
    response = alice_api.post(f"/api/jobs/{job.pk}/resume/")
    assert response.status_code == 409 and "has no resume" in response.json()["detail"]
    assert 'id="resume-button"' not in alice_client.get(reverse("monitor:dashboard", args=[job.pk])).content.decode()


def test_the_dashboard_offers_resume_for_a_failed_job_with_a_checkpoint(alice_client: Any, team_a: Any,
                                                                        alice: Any) -> None:
    job = finished_job(team_a, alice, Kind.RL, Status.FAILED)
    page = alice_client.get(reverse("monitor:dashboard", args=[job.pk])).content.decode()
    assert 'id="resume-button"' in page and 'Resume from step <span id="resume-step">3</span>' in page
    form = page[page.rindex("<form", 0, page.index('id="resume-button"')):page.index('id="resume-button"')]
    assert f'action="{reverse("jobs:resume", args=[job.pk])}"' in form and 'name="csrfmiddlewaretoken"' in form
    assert " hidden" not in form[:form.index(">")]
    response = alice_client.post(reverse("jobs:resume", args=[job.pk]))
    assert response.status_code == 302
    assert TrainingJob.objects.get(resumed_from__job=job).resume_from.endswith("checkpoint-000003")


def test_the_dashboard_offers_no_resume_for_a_running_job_or_one_without_a_checkpoint(
        alice_client: Any, team_a: Any, alice: Any) -> None:
    running = finished_job(team_a, alice, Kind.RL, Status.RUNNING)
    page = alice_client.get(reverse("monitor:dashboard", args=[running.pk])).content.decode()
    # A running job's form is in the page but hidden: the page shows it if the job ends failed or cancelled.
    tag = page[page.index('<form method="post" action="' + reverse("jobs:resume", args=[running.pk])):]
    assert 'id="cancel-button"' in page and " hidden>" in tag[:tag.index(">") + 1]
    bare = TrainingJob.objects.create(team=team_a, created_by=alice, name="y", config={}, status=Status.CANCELLED)
    page = alice_client.get(reverse("monitor:dashboard", args=[bare.pk])).content.decode()
    assert 'id="cancel-button"' in page and 'id="resume-button"' not in page


def test_the_dashboard_of_another_teams_failed_job_offers_no_resume(bob_client: Any, team_a: Any,
                                                                    alice: Any) -> None:
    job = finished_job(team_a, alice, Kind.RL, Status.FAILED)
    response = bob_client.get(reverse("monitor:dashboard", args=[job.pk]))
    assert response.status_code == 404 and 'id="resume-button"' not in response.content.decode()
    assert bob_client.post(reverse("jobs:resume", args=[job.pk])).status_code == 404
    assert not TrainingJob.objects.filter(resumed_from__job=job).exists()
