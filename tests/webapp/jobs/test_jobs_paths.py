"""Teams stay apart on disk: each team's runs live in its own folder, and no job reads another team's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse

from tests.webapp.factories import builtin_entries, launch_data
from tests.webapp.helpers import wait_for
from webapp.jobs.models import Status, TrainingJob


@pytest.fixture
def entries(db: None) -> tuple[Any, Any]:
    return builtin_entries()


@pytest.fixture
def runs(settings: Any, tmp_path: Path) -> Path:
    settings.AGENTFLY_RUNS_DIR = tmp_path / "runs"
    return tmp_path / "runs"


def saved_model(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    return folder


def model_path_errors(client: Any, team: Any, entries: tuple[Any, Any], path: Path | str) -> list[str]:
    response = client.post(reverse("jobs:launch"), launch_data(team, *entries, model_source="path",
                                                                model_path=str(path), queue="gpu"))
    if response.status_code == 302:
        return []
    return list(response.context["form"].errors.get("model_path", []))


def test_team_b_cannot_launch_on_a_model_inside_team_a_folder(
        alice_client: Any, bob_client: Any, bob_api: Any, team_a: Any, team_b: Any, entries: tuple[Any, Any],
        runs: Path, settings: Any) -> None:
    checkpoint = saved_model(runs / "team-a" / "job-1" / "checkpoint-000003")
    errors = model_path_errors(bob_client, team_b, entries, checkpoint)
    assert "outside your team's folder" in " ".join(errors) and str(runs / "team-b") in " ".join(errors)
    response = bob_api.post("/api/jobs/", {"name": "steal", "team": "team-b", "tools": [entries[0].pk],
                                           "reward": entries[1].pk, "model_source": "path",
                                           "model_path": str(checkpoint)}, format="json")
    assert response.status_code == 400 and "outside your team's folder" in str(response.json()["model_path"])
    assert not TrainingJob.objects.exists()
    # The owner may, even when AGENTFLY_ALLOWED_PATHS names only shared folders: its own folder is always allowed.
    settings.AGENTFLY_ALLOWED_PATHS = [runs.parent / "shared"]
    assert model_path_errors(alice_client, team_a, entries, checkpoint) == []


def test_a_symlink_into_another_teams_folder_is_refused(
        bob_client: Any, team_b: Any, entries: tuple[Any, Any], runs: Path, tmp_path: Path) -> None:
    checkpoint = saved_model(runs / "team-a" / "job-1" / "checkpoint-000003")
    (runs / "team-b").mkdir()
    inside_own = runs / "team-b" / "looks-mine"
    inside_own.symlink_to(checkpoint)
    elsewhere = tmp_path / "innocent"
    elsewhere.symlink_to(runs / "team-a")
    for path in (inside_own, elsewhere / "job-1" / "checkpoint-000003",
                 f"{runs}/team-b/../team-a/job-1/checkpoint-000003"):
        assert "outside your team's folder" in " ".join(model_path_errors(bob_client, team_b, entries, path)), path


def test_a_task_file_or_folder_of_no_team_in_the_runs_folder_is_refused(
        bob_client: Any, team_b: Any, entries: tuple[Any, Any], runs: Path) -> None:
    (runs / "team-a").mkdir(parents=True)
    (runs / "team-a" / "train.jsonl").write_text('{"question": "1+1", "answer": "2"}\n')
    response = bob_client.post(reverse("jobs:launch"), launch_data(team_b, *entries, task="jsonl",
                                                                    task_path=str(runs / "team-a" / "train.jsonl")))
    assert "outside your team's folder" in " ".join(response.context["form"].errors["task_path"])
    # The old shared tiny-model folder belongs to nobody.
    assert model_path_errors(bob_client, team_b, entries, saved_model(runs / "models" / "tiny-0"))


def test_a_run_folder_from_before_team_folders_belongs_to_its_jobs_team(
        alice_client: Any, bob_client: Any, team_a: Any, team_b: Any, entries: tuple[Any, Any], runs: Path) -> None:
    job = TrainingJob.objects.create(team=team_a, name="old", config={}, queue="cpu")
    checkpoint = saved_model(runs / f"job-{job.pk}" / "checkpoint-000002")
    assert model_path_errors(alice_client, team_a, entries, checkpoint) == []
    assert model_path_errors(bob_client, team_b, entries, checkpoint)


def test_a_team_named_like_an_old_run_folder_gets_a_slug_of_its_own(db: None) -> None:
    from webapp.accounts.models import do_create_team

    assert do_create_team("Job 5", None).slug == "team-job-5"
    assert [do_create_team(name, None).slug for name in ("Job", "job!")] == ["team-job", "team-job-2"]


def test_a_launched_tiny_model_is_built_inside_the_teams_folder(
        alice_client: Any, team_a: Any, entries: tuple[Any, Any], runs: Path) -> None:
    response = alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries, queue="gpu"))
    assert response.status_code == 302
    assert TrainingJob.objects.get().config["model"]["path"] == str(runs / "team-a" / "models" / "tiny-0")


# ------------------------------------------------------------------------------------------- on the worker
@pytest.mark.slow
@pytest.mark.integration
def test_a_jobs_checkpoints_live_under_its_teams_folder(
        alice_api: Any, builtins: dict[str, Any], runs_dir: Path) -> None:
    payload = {"name": "tiny calculator", "team": "team-a", "tools": [builtins["calculator"].pk],
               "reward": builtins["math_equal"].pk, "steps": 2, "prompts_per_step": 1, "group_size": 2,
               "max_turns": 1, "max_new_tokens": 8, "eval_size": 1, "save_every": 1}
    job = alice_api.post("/api/jobs/", payload, format="json").json()
    done = wait_for(lambda: TrainingJob.objects.filter(pk=job["id"], status__in=Status.values[2:]).first(), 180,
                    "the job to finish", 0.5)
    assert done.status == Status.SUCCEEDED, done.error
    team_folder = runs_dir.resolve() / "team-a"
    assert done.checkpoints.exists()
    for checkpoint in done.checkpoints.all():
        assert Path(checkpoint.path).resolve().is_relative_to(team_folder / f"job-{done.pk}")
    assert (team_folder / "models" / "tiny-0" / "config.json").is_file()
    assert not (runs_dir / f"job-{done.pk}").exists() and not (runs_dir / "models").exists()


@pytest.mark.integration
def test_a_job_whose_stored_config_points_into_another_teams_folder_fails_on_the_worker(
        builtins: dict[str, Any], alice: Any, team_a: Any, bob: Any, team_b: Any, runs_dir: Path) -> None:
    from webapp.jobs.actions import do_launch_job

    checkpoint = saved_model(runs_dir / "team-a" / "job-999" / "checkpoint-000001")
    # Written behind the form and the API, as the admin or a shell could.
    config = {"steps": 1, "model": {"path": str(checkpoint), "build_tiny": False}}
    job, _ = do_launch_job(user=bob, team=team_b, name="behind the API", config=config, queue="cpu",
                           tool_versions=[], reward_version=None)
    done = wait_for(lambda: TrainingJob.objects.filter(pk=job.pk, status__in=Status.values[2:]).first(), 60,
                    "the worker to refuse the job", 0.3)
    assert done.status == Status.FAILED
    assert "PathRefused: model.path" in done.error and "outside your team's folder" in done.error
    assert not done.checkpoints.exists()


@pytest.mark.integration
def test_a_starting_worker_sweeps_the_sandbox_folders_of_dead_processes(
        transactional_db: None, runs_dir: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    from agentfly.resources.backends.local import start_time
    from tests.webapp.helpers import Worker, worker_env

    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    started = start_time(owner.pid)
    owner.kill()
    owner.wait()
    boxes = tmp_path / "boxes"
    dead = boxes / f"{owner.pid}-{started}-left" / "work"
    dead.mkdir(parents=True)
    (dead / "scratch.txt").write_text("left by a SIGKILLed worker")
    worker = Worker("gpu", {**worker_env(runs_dir), "AGENTFLY_SANDBOX_DIR": str(boxes)}, tmp_path / "worker.log")
    try:
        worker.wait_ready()
        wait_for(lambda: not dead.parent.exists(), 10, "the sweep to remove the dead owner's folder")
    finally:
        worker.stop()


def test_the_compose_file_allows_shared_data_but_not_every_teams_runs() -> None:
    import yaml

    from tests.webapp.helpers import ROOT

    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    for name in ("web", "worker-cpu", "worker-gpu"):
        env = services[name]["environment"]
        runs = Path(env["AGENTFLY_RUNS_DIR"])
        allowed = [Path(p) for p in env["AGENTFLY_ALLOWED_PATHS"].split(",")]
        assert allowed and not any(runs.is_relative_to(p) for p in allowed), (name, allowed)
        # Each shared folder is a read-only mount: a job reads it, never writes into another team's data.
        assert all(any(v.endswith(f":{p}:ro") for v in services[name]["volumes"]) for p in allowed), name


@pytest.mark.integration
def test_try_it_python_code_cannot_read_the_projects_settings_or_git(
        alice_client: Any, builtins: dict[str, Any]) -> None:
    import asyncio

    from agentfly.resources import PythonSandbox
    from tests.webapp.helpers import ROOT

    async def filesystem() -> str:
        async with PythonSandbox() as box:
            return str(box.isolation()["filesystem"])

    if not (report := asyncio.run(filesystem())).startswith("landlock"):
        pytest.skip(f"filesystem isolation not in effect here: {report}")
    # The worker runs from the project root, as `celery -A webapp worker` does in a checkout.
    for path in (ROOT / "webapp" / "settings.py", ROOT / ".git", ROOT / "pyproject.toml"):
        code = f"open({str(path)!r}, 'rb').read()"
        response = alice_client.post(reverse("registry:try", args=[builtins["python_code"].pk]),
                                     {"arguments": json.dumps({"code": code})})
        observation = response.context["result"]["observation"]
        assert "PermissionError" in observation or "FileNotFoundError" in observation, (path, observation)


# ------------------------------------------------------------------------ every path, found by its type
def test_every_path_of_a_config_is_found_by_its_type_tracker_folders_included(
        team_a: Any, team_b: Any, runs: Path) -> None:
    from webapp.jobs.paths import PathRefused, check_config, config_paths

    theirs = str(runs / "team-a" / "job-1")
    config = {"trackers": ["tensorboard", "wandb", "mlflow"],
              "tracker_options": {"tensorboard": {"logdir": theirs}, "wandb": {"dir": theirs},
                                  "mlflow": {"tracking_uri": f"file:{theirs}/mlruns"}},
              "model": {"path": str(runs / "team-b" / "m"), "gguf_file": "../../team-a/job-1/w.gguf"},
              "data": {"task": "key_chain_long"}}
    found = dict(config_paths(config))
    assert set(found) == {"tracker_options.tensorboard.logdir", "tracker_options.wandb.dir",
                          "tracker_options.mlflow.tracking_uri", "model.path", "model.gguf_file"}
    assert found["tracker_options.mlflow.tracking_uri"] == f"{theirs}/mlruns"
    for key in set(found) - {"model.path"}:
        alone = {"tracker_options": config["tracker_options"]} if key.startswith("tracker") else {"model": config["model"]}
        with pytest.raises(PathRefused, match="outside your team's folder") as refused:
            check_config(alone, team_b)
        assert refused.value.key is not None and refused.value.key.startswith(key.split(".")[0])
    check_config({"tracker_options": {"tensorboard": {"logdir": str(runs / "team-b" / "tb")},
                                      "mlflow": {"tracking_uri": "https://mlflow.example.org"}}}, team_b)
    with pytest.raises(PathRefused, match="neither a tracking server"):
        check_config({"tracker_options": {"mlflow": {"tracking_uri": "sqlite:////var/lib/other.db"}}}, team_b)


@pytest.mark.integration
def test_a_tensorboard_logdir_pointed_into_another_teams_run_fails_on_the_worker(
        builtins: dict[str, Any], bob: Any, team_b: Any, runs_dir: Path) -> None:
    from webapp.jobs.actions import do_launch_job

    target = runs_dir / "team-a" / "job-998" / "tensorboard"
    # Written behind the form and the API, as a staff member editing the job in the admin could.
    config = {"steps": 1, "trackers": ["tensorboard"], "tracker_options": {"tensorboard": {"logdir": str(target)}}}
    job, _ = do_launch_job(user=bob, team=team_b, name="planted log", config=config, queue="cpu",
                           tool_versions=[], reward_version=None)
    done = wait_for(lambda: TrainingJob.objects.filter(pk=job.pk, status__in=Status.values[2:]).first(), 60,
                    "the worker to refuse the job", 0.3)
    assert done.status == Status.FAILED
    assert "PathRefused: tracker_options.tensorboard.logdir" in done.error and "outside your team's folder" in done.error
    assert not target.exists()


def test_with_no_allowed_paths_a_path_outside_the_teams_folder_is_refused_alike_whether_it_exists_or_not(
        bob_client: Any, team_b: Any, entries: tuple[Any, Any], runs: Path, tmp_path: Path, settings: Any) -> None:
    settings.AGENTFLY_ALLOWED_PATHS = []
    existing, missing = saved_model(tmp_path / "elsewhere" / "model"), tmp_path / "elsewhere" / "nothing"
    answers = [" ".join(model_path_errors(bob_client, team_b, entries, path)).replace(str(path), "PATH")
               for path in (existing, missing)]
    assert answers[0] and answers[0] == answers[1]
    assert "AGENTFLY_ALLOWED_PATHS: none set" in answers[0]
    # A folder the operator lists is allowed, and the team's own folder always is.
    settings.AGENTFLY_ALLOWED_PATHS = [tmp_path / "elsewhere"]
    assert model_path_errors(bob_client, team_b, entries, existing) == []


def test_a_symlink_loop_as_model_path_is_a_400_naming_the_loop_not_a_500(
        alice_client: Any, alice_api: Any, team_a: Any, entries: tuple[Any, Any], runs: Path) -> None:
    (runs / "team-a").mkdir(parents=True)
    loop = runs / "team-a" / "loop"
    loop.symlink_to(loop)
    other = runs / "team-a" / "ping"
    other.symlink_to(runs / "team-a" / "pong")
    (runs / "team-a" / "pong").symlink_to(other)
    for path in (loop, other / "model"):
        response = alice_api.post("/api/jobs/", {"name": "loop", "team": "team-a", "tools": [entries[0].pk],
                                                 "reward": entries[1].pk, "model_source": "path",
                                                 "model_path": str(path)}, format="json")
        assert response.status_code == 400, response.content
        assert "symbolic link that loops" in str(response.json()["model_path"])
        assert "symbolic link that loops" in " ".join(model_path_errors(alice_client, team_a, entries, path))
    assert not TrainingJob.objects.exists()
