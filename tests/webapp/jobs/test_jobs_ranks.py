"""Multi-rank jobs from the browser's API: ``gpus: N`` becomes a ``torchrun`` process group on the worker.

On the ``cpu`` queue the ranks are CPU processes (one thread each), which is how these tests run them through
the session's real worker.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from contextlib import contextmanager
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


@pytest.mark.slow
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


def torchrun_pids(run_dir: Path) -> list[int]:
    """The job's ``torchrun`` (its command line names the run's launch.yaml and torch.distributed.run)."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            words = [w.decode(errors="replace") for w in (proc / "cmdline").read_bytes().split(b"\0")]
        except OSError:
            continue
        if str(run_dir / "launch.yaml") in words and "torch.distributed.run" in words:
            pids.append(int(proc.name))
    return pids


def answering(*workers: Any) -> None:
    """Wait until the new workers answer the launch form's question about their devices (a worker that is
    ready may still be loading when the first broadcast goes out)."""
    from webapp.jobs.queues import device_replies

    names = {w.name.replace("%h", socket.gethostname()) for w in workers}

    def heard() -> bool:
        forget()
        return names <= set(device_replies(timeout=1.0))

    wait_for(heard, 60, f"{', '.join(sorted(names))} to answer")


@contextmanager
def session_worker_off_the_cpu_queue(worker: Any) -> Iterator[None]:
    """The session's worker stops taking ``cpu`` tasks (it keeps ``try``), so a job goes to a worker the test
    may kill; it takes them again afterwards, whatever happened."""
    from webapp.celery import app

    name = [worker.name.replace("%h", socket.gethostname())]
    assert app.control.cancel_consumer("cpu", destination=name, reply=True, timeout=10)
    try:
        yield
    finally:
        assert app.control.add_consumer("cpu", destination=name, reply=True, timeout=10)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_killed_worker_takes_its_ranks_with_it_and_the_job_fails_in_the_heartbeat_window_then_resumes(
        alice_api: Any, builtins: dict[str, Any], worker: Any, runs_dir: Path, tmp_path: Path) -> None:
    from django.conf import settings

    from tests.webapp.helpers import Worker, worker_env
    from webapp.jobs.tasks import fail_stale_jobs

    with session_worker_off_the_cpu_queue(worker):
        doomed = Worker("cpu", worker_env(runs_dir), tmp_path / "doomed-worker.log")
        try:
            doomed.wait_ready()
            answering(doomed)
            # Far more steps than the ranks could train while the test waits for them to die: ranks left alive
            # would still be training, not finished.
            job = launch(alice_api, builtins, steps=1000)
            run_dir = paths.job_dir(TrainingJob.objects.get(pk=job["id"]))
            wait_for(lambda: TrainingJob.objects.get(pk=job["id"]).checkpoints.filter(step__gte=2).exists(), 240,
                     "a checkpoint at step 2", 0.3)
            assert len(rank_pids(run_dir)) == 2 and len(torchrun_pids(run_dir)) == 1
            doomed.kill()  # SIGKILL, worker and pool: a crashed host's supervisor, the OOM killer
        finally:
            doomed.stop()
        # torchrun dies with the task's process and stops its ranks: none trains on unseen.
        wait_for(lambda: rank_pids(run_dir) == [] and torchrun_pids(run_dir) == [], 45,
                 "the ranks to die with their worker", 0.3)
        killed_at = TrainingJob.objects.get(pk=job["id"])
        assert killed_at.status == Status.RUNNING  # only the sweep can tell a dead worker from a slow one

        def swept() -> dict[str, Any] | None:  # what beat does every few seconds, on the session's worker
            fail_stale_jobs.apply_async(queue="try")
            return job_in(alice_api, job["id"], "failed")

        failed = wait_for(swept, settings.JOB_HEARTBEAT_TIMEOUT + 10, "the dead worker to be noticed", 0.5)
    last = killed_at.checkpoints.order_by("-step").first()
    assert last is not None and f"last checkpoint is step {last.step}" in failed["error"]
    assert Path(last.path, "model.safetensors").is_file()
    assert {p.name for p in Path(last.path).glob("rank-*.pt")} == {"rank-00000.pt", "rank-00001.pt"}

    # `resume` continues it on the session's worker, from that checkpoint, on two ranks again.
    resumed = alice_api.post(f"/api/jobs/{job['id']}/resume/").json()
    wait_for(lambda: alice_api.get(f"/api/jobs/{resumed['id']}/events/?type=metrics").json()["events"], 240,
             "the resumed job's first step", 0.5)
    events = alice_api.get(f"/api/jobs/{resumed['id']}/events/?type=metrics&limit=5000").json()["events"]
    assert min(e["step"] for e in events) == last.step + 1

    # A SIGKILLed torchrun cannot stop its ranks; they die with it (trainer.distributed.die_with_launcher).
    second_dir = paths.job_dir(TrainingJob.objects.get(pk=resumed["id"]))
    os.kill(wait_for(lambda: torchrun_pids(second_dir), 30, "the resumed job's torchrun")[0], signal.SIGKILL)
    wait_for(lambda: rank_pids(second_dir) == [], 30, "the ranks to die with their torchrun", 0.3)
    ended = wait_for(lambda: job_in(alice_api, resumed["id"], *Status.values[2:]), 60, "the job to fail", 0.5)
    assert ended["status"] == "failed" and "torchrun was killed by SIGKILL" in ended["error"], ended["error"]


def test_more_nodes_than_the_queue_has_hosts_are_refused_with_the_hosts_it_has(
        alice_api: Any, builtins: dict[str, Any], worker: Any) -> None:
    answering(worker)
    errors = launch(alice_api, builtins, expect=400, gpus=1, nodes=2)
    assert f"report 1 host(s) with 1 CPU cores ({socket.gethostname()})" in str(errors.get("nodes")), errors
    errors = launch(alice_api, builtins, expect=400, gpus=1, nodes=3, prompts_per_step=2)
    assert "3 nodes of 1 ranks (3 in all) cannot share 2 prompts" in str(errors["nodes"])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_2_node_job_runs_one_torchrun_per_worker_and_succeeds_with_rank_0s_events_stored_once(
        alice_api: Any, builtins: dict[str, Any], worker: Any, runs_dir: Path, tmp_path: Path) -> None:
    from tests.webapp.helpers import Worker, worker_env

    # Two workers of the cpu queue named for two hosts stand in for two machines (they share this one's
    # runs folder, as real hosts share AGENTFLY_RUNS_DIR); the rendezvous is on the first node's address.
    env = {**worker_env(runs_dir), "AGENTFLY_NODE_ADDRESS": "127.0.0.1"}
    with session_worker_off_the_cpu_queue(worker):
        hosts = [Worker("cpu", env, tmp_path / f"{h}.log", host=h) for h in ("host-a", "host-b")]
        try:
            for w in hosts:
                w.wait_ready()
            answering(*hosts)
            job = launch(alice_api, builtins, gpus=1, nodes=2, steps=2)
            assert job["config"]["nodes"] == 2 and "ranks" not in job["config"]
            done = wait_for(lambda: job_in(alice_api, job["id"], *Status.values[2:]), 300, "the job to finish", 0.5)
        finally:
            for w in hosts:
                w.stop()
    assert done["status"] == "succeeded", done["error"]
    assert done["step"] == 2 and "reward/mean" in done["final_metrics"]
    events = alice_api.get(f"/api/jobs/{job['id']}/events/?types=metrics&limit=5000").json()["events"]
    assert [e["step"] for e in events if "time/rollout" in e["data"]] == [1, 2]  # global rank 0's, once each
    logs = alice_api.get(f"/api/jobs/{job['id']}/events/?types=log&limit=5000").json()["events"]
    # Each node on its own worker, one per host.
    placed = {m["data"]["message"].split()[1]: m["data"]["message"].split("@")[1].split(";")[0] for m in logs
              if m["data"].get("message", "").startswith("node ")}
    assert sorted(placed) == ["0", "1"] and sorted(placed.values()) == ["host-a", "host-b"], placed
    latest = Path(alice_api.get(f"/api/jobs/{job['id']}/checkpoints/").json()[0]["path"])
    assert {p.name for p in latest.glob("rank-*.pt")} == {"rank-00000.pt", "rank-00001.pt"}
