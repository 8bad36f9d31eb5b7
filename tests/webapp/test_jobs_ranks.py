"""Multi-rank jobs from the browser's API: ``gpus: N`` becomes a ``torchrun`` process group on the worker.

On the ``cpu`` queue the ranks are CPU processes (one thread each), which is how these tests run them through
the session's real worker.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.webapp.helpers import wait_for
from webapp.jobs import paths
from webapp.jobs.models import Status, TrainingJob
from webapp.jobs.queues import forget

pytestmark = pytest.mark.integration


def launch(api: Any, builtins: dict[str, Any], expect: int = 201, **fields: Any) -> dict[str, Any]:
    payload = {"name": "two ranks", "team": "team-a", "tools": [builtins["calculator"].pk],
               "reward": builtins["math_equal"].pk, "steps": 2, "prompts_per_step": 2, "group_size": 2,
               "max_turns": 2, "max_new_tokens": 8, "eval_size": 2, "save_every": 1, "gpus": 2, **fields}
    response = api.post("/api/jobs/", payload, format="json")
    assert response.status_code == expect, response.content
    return response.json()


def job_in(api: Any, job_id: int, *statuses: str) -> dict[str, Any] | None:
    job = api.get(f"/api/jobs/{job_id}/").json()
    return job if job["status"] in statuses else None


def rank_pids(run_dir: Path) -> list[int]:
    """The processes of the job's ranks (not torchrun itself): their command line names the run's launch.yaml."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [w.decode(errors="replace") for w in cmd]
        if str(run_dir / "launch.yaml") in words and "torch.distributed.run" not in words:
            pids.append(int(proc.name))
    return pids


@pytest.fixture(autouse=True)
def fresh_device_answers() -> None:
    forget()


def test_a_2_rank_cpu_job_trains_on_the_worker_with_rank_0s_events_stored_once(
        alice_api: Any, builtins: dict[str, Any]) -> None:
    job = launch(alice_api, builtins)
    assert job["config"]["ranks"] == 2
    done = wait_for(lambda: job_in(alice_api, job["id"], *Status.values[2:]), 240, "the job to finish", 0.5)
    assert done["status"] == "succeeded", done["error"]
    assert done["step"] == 2 and "reward/mean" in done["final_metrics"]
    events = alice_api.get(f"/api/jobs/{job['id']}/events/?type=metrics&limit=5000").json()["events"]
    steps = [e["step"] for e in events if "time/rollout" in e["data"]]
    assert steps == [1, 2]  # rank 0's, once each
    checkpoints = alice_api.get(f"/api/jobs/{job['id']}/checkpoints/").json()
    latest = Path(checkpoints[0]["path"])
    assert checkpoints[0]["step"] == 2 and (latest / "model.safetensors").is_file()
    assert {p.name for p in latest.glob("rank-*.pt")} == {"rank-00000.pt", "rank-00001.pt"}


def test_the_launch_form_asks_for_ranks_and_a_form_without_them_launches_one_rank(
        alice_client: Any, team_a: Any) -> None:
    from django.urls import reverse

    from tests.webapp.factories import builtin_entries, launch_data

    page = alice_client.get(reverse("jobs:launch")).content.decode()
    assert 'name="gpus"' in page
    tool, reward = builtin_entries()
    response = alice_client.post(reverse("jobs:launch"), launch_data(team_a, tool, reward))
    assert response.status_code == 302, response.content.decode()[:2000]
    assert "ranks" not in TrainingJob.objects.get().config


def test_ranks_that_do_not_divide_the_prompts_are_refused_on_the_field(
        alice_api: Any, builtins: dict[str, Any]) -> None:
    errors = launch(alice_api, builtins, expect=400, gpus=3, prompts_per_step=4)
    assert "divides 4" in str(errors["gpus"])


def test_more_ranks_than_the_queues_workers_report_are_refused_with_what_they_have(
        alice_api: Any, builtins: dict[str, Any]) -> None:
    cores = os.cpu_count() or 1
    errors = launch(alice_api, builtins, expect=400, gpus=64, prompts_per_step=64)
    assert f"report at most {cores} CPU cores" in str(errors["gpus"])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_cancel_reaches_every_rank_and_a_dead_rank_fails_the_job_which_resumes_from_its_checkpoint(
        alice_api: Any, builtins: dict[str, Any]) -> None:
    from django.conf import settings

    # Cancel: the ranks stop together between steps, with a checkpoint, and none is left running.
    job = launch(alice_api, builtins, steps=40)
    run_dir = paths.job_dir(TrainingJob.objects.get(pk=job["id"]))
    wait_for(lambda: alice_api.get(f"/api/jobs/{job['id']}/").json()["step"] >= 1, 240, "a step", 0.5)
    assert len(rank_pids(run_dir)) == 2
    alice_api.post(f"/api/jobs/{job['id']}/cancel/")
    done = wait_for(lambda: job_in(alice_api, job["id"], *Status.values[2:]), 120, "the cancel", 0.5)
    assert done["status"] == "cancelled" and done["step"] < 40
    assert rank_pids(run_dir) == []

    # A rank killed mid-run: torchrun stops the other, the job fails within the heartbeat window.
    resumed = alice_api.post(f"/api/jobs/{job['id']}/resume/").json()
    wait_for(lambda: TrainingJob.objects.get(pk=resumed["id"]).checkpoints.filter(step__gt=done["step"]).exists(),
             240, "the resumed job's first checkpoint", 0.3)
    second_dir = paths.job_dir(TrainingJob.objects.get(pk=resumed["id"]))
    pids = wait_for(lambda: rank_pids(second_dir), 30, "the ranks")
    os.kill(pids[-1], signal.SIGKILL)
    failed = wait_for(lambda: job_in(alice_api, resumed["id"], "failed"), settings.JOB_HEARTBEAT_TIMEOUT + 10,
                      "the dead rank to fail the job", 0.5)
    assert "a rank of the 2-rank run failed" in failed["error"]
    assert wait_for(lambda: rank_pids(second_dir) == [], 30, "the other rank to be stopped")
    last = TrainingJob.objects.get(pk=resumed["id"]).checkpoints.order_by("-step").first()
    assert last is not None and Path(last.path, "model.safetensors").is_file()

    # `resume` continues it from that checkpoint.
    again = alice_api.post(f"/api/jobs/{resumed['id']}/resume/").json()
    wait_for(lambda: alice_api.get(f"/api/jobs/{again['id']}/events/?type=metrics").json()["events"], 240,
             "the second resume's first step", 0.5)
    events = alice_api.get(f"/api/jobs/{again['id']}/events/?type=metrics&limit=5000").json()["events"]
    assert min(e["step"] for e in events) == last.step + 1
    alice_api.post(f"/api/jobs/{again['id']}/cancel/")
    wait_for(lambda: job_in(alice_api, again["id"], *Status.values[2:]), 120, "the last cancel", 0.5)
