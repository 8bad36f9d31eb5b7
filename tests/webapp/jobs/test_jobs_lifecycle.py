"""A job's state is the truth at any moment of its life, on PostgreSQL and on the demo's SQLite.

Fifty real CPU jobs on the session's one worker are cancelled at seeded random moments (before the first
step, mid-step, while a checkpoint is written, during the final evaluation, or the moment they were
launched), and every one must end ``cancelled`` with a last checkpoint that exists, loads, and is the job's
step. A long job must end ``succeeded`` with progress and checkpoints tracked all along.

The session's database decides where they run: PostgreSQL by default, the demo's SQLite settings (WAL, busy
timeout, ``webapp/settings.py``) with ``DATABASE_URL=sqlite:///FILE``. From a PostgreSQL session,
``test_the_lifecycle_holds_on_the_demos_sqlite`` runs this module again in a child session on SQLite. Set
``AGENTFLY_STRESS_SEED`` to replay a failed draw (every failure message names its seed; the session prints
it with ``-s``).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from tests.webapp.factories import launch_tiny_job
from tests.webapp.helpers import ROOT, wait_for
from webapp.jobs import paths
from webapp.jobs.models import FINISHED, Status, TrainingJob

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CANCELS = int(os.environ.get("AGENTFLY_STRESS_CANCELS", "50"))  # fewer only while developing the test


def launch(api: Any, builtins: dict[str, Any], **fields: Any) -> int:
    return launch_tiny_job(api, builtins, **{"name": "lifecycle", **fields})


def row(job_id: int) -> TrainingJob:
    return TrainingJob.objects.get(pk=job_id)


# Each moment waits for a point of the job's life, then a random while more (drawn from the seeded `rng`),
# short enough that the job is still in that part of its life.
def at_launch(job_id: int, rng: random.Random) -> None:
    time.sleep(rng.uniform(0, 0.3))  # queued, or just claimed


def before_the_first_step(job_id: int, rng: random.Random) -> None:
    wait_for(lambda: row(job_id).status == Status.RUNNING, 120, "the claim", 0.01)
    time.sleep(rng.uniform(0, 0.2))  # loading the model, building the agent, the first rollout


def mid_step(job_id: int, rng: random.Random) -> None:
    after = rng.randint(1, 3)
    wait_for(lambda: row(job_id).step >= after, 120, f"step {after}", 0.02)
    time.sleep(rng.uniform(0, 0.4))


def while_a_checkpoint_is_written(job_id: int, rng: random.Random) -> None:
    # The trainer writes a checkpoint into a `.partial` folder and renames it when complete.
    run_dir = paths.job_dir(row(job_id))
    after = rng.randint(1, 3)
    wait_for(lambda: (run_dir / f".checkpoint-{after:06d}.partial").exists()
             or (run_dir / f"checkpoint-{after:06d}").exists(), 120, f"checkpoint {after} being written", 0.005)
    time.sleep(rng.uniform(0, 0.01))


def during_the_final_evaluation(job_id: int, rng: random.Random) -> None:
    job = row(job_id)
    wait_for(lambda: row(job_id).step >= job.total_steps, 120, "the last step", 0.02)
    time.sleep(rng.uniform(0, 0.2))


Moment = Callable[[int, random.Random], None]
MOMENTS: list[tuple[Moment, dict[str, Any]]] = [
    (at_launch, {}),
    (before_the_first_step, {}),
    # Twelve steps: the rest of a six-step job (steps of about 0.1 s since the engine stopped copying its
    # KV cache) could be over before mid_step's random wait of up to 0.4 s ended.
    (mid_step, {"steps": 12}),
    (while_a_checkpoint_is_written, {}),
    # Two steps, then an evaluation long enough for a cancel to land inside it on a quiet machine too (256
    # prompts of up to 16 tokens: about a second; 32 prompts of 4 tokens were over before the cancel came).
    (during_the_final_evaluation, {"steps": 2, "eval_size": 256, "max_new_tokens": 16}),
]


def assert_consistent_last_checkpoint(job: TrainingJob, where: str) -> None:
    """The checkpoint the job's row names is on disk, complete, loads, and is of the job's step."""
    from safetensors.torch import load_file

    from trainer.checkpoint import load_state

    checkpoint = job.last_checkpoint
    if job.started_at is None:  # cancelled while queued: it never ran
        assert checkpoint is None and job.step == 0, where
        return
    # The job saves when it stops, so its last checkpoint is its last step.
    assert checkpoint is not None, f"{where}: no checkpoint recorded"
    assert checkpoint.step == job.step, f"{where}: checkpoint {checkpoint.step} != step {job.step}"
    path = Path(checkpoint.path)
    assert load_state(path)["step"] == checkpoint.step, where
    assert load_file(path / "model.safetensors"), where
    assert not list(path.parent.glob(".checkpoint-*.partial")), f"{where}: a half-written checkpoint is left"


@pytest.mark.stress
@pytest.mark.timeout(3600)
def test_cancels_at_50_random_moments_all_end_cancelled_with_a_consistent_last_checkpoint(
        alice_api: Any, builtins: dict[str, Any]) -> None:
    seed = int(os.environ.get("AGENTFLY_STRESS_SEED") or random.SystemRandom().randrange(2**32))
    print(f"cancel stress on {connection.vendor}: AGENTFLY_STRESS_SEED={seed}")
    rng = random.Random(seed)
    draws = [MOMENTS[i % len(MOMENTS)] for i in range(CANCELS)]  # each moment equally often, in a seeded order
    rng.shuffle(draws)
    for n, (moment, fields) in enumerate(draws, 1):
        job_id = launch(alice_api, builtins, **fields)
        moment(job_id, rng)
        where = f"cancel {n} of {CANCELS} ({moment.__name__}, job {job_id}, {connection.vendor}, seed {seed})"
        response = alice_api.post(f"/api/jobs/{job_id}/cancel/").json()
        assert response["cancel_requested"], f"{where}: the cancel came too late: {response}"
        wait_for(lambda j=job_id: row(j).status in FINISHED, 180, where, 0.1)
        job = row(job_id)
        assert job.status == Status.CANCELLED, f"{where}: ended {job.status}: {job.error}"
        assert job.step <= job.total_steps, where
        assert_consistent_last_checkpoint(job, where)
        api = alice_api.get(f"/api/jobs/{job_id}/").json()
        assert (api["status"], api["step"]) == ("cancelled", job.step), where
        states = alice_api.get(f"/api/jobs/{job_id}/events/?types=status").json()["events"]
        assert states[-1]["data"]["state"] == "cancelled", where  # what the dashboard shows last


LONG = 300


@pytest.mark.stress
@pytest.mark.timeout(1800)
def test_a_long_job_on_the_demos_sqlite_succeeds_with_progress_and_checkpoints_tracked_all_along(
        alice_api: Any, builtins: dict[str, Any]) -> None:
    if connection.vendor != "sqlite":
        pytest.skip("a long job's writes contend on the demo's SQLite; test_the_lifecycle_holds_on_the_demos_sqlite "
                    "runs it there")
    job_id = launch(alice_api, builtins, steps=LONG, save_every=25, eval_size=2)
    seen_steps: list[int] = []
    seen_checkpoints: list[int] = []
    deadline = time.monotonic() + 1500
    while (job := row(job_id)).status not in FINISHED:
        assert time.monotonic() < deadline, f"job {job_id} still {job.status} at step {job.step}"
        assert not job.is_stale, f"job {job_id} stopped beating at step {job.step}"
        seen_steps.append(job.step)
        if (checkpoint := job.last_checkpoint) is not None:
            seen_checkpoints.append(checkpoint.step)
        time.sleep(0.5)
    assert job.status == Status.SUCCEEDED, job.error
    assert job.step == LONG and "reward/mean" in job.final_metrics
    # Tracked all along: the row's step only ever grew and was seen at many points of the run, and every
    # checkpoint row appeared while the job ran, within a save of its step.
    assert seen_steps == sorted(seen_steps) and len(set(seen_steps)) > LONG // 10, seen_steps
    assert set(range(25, LONG, 25)) <= {s for s in seen_checkpoints}, seen_checkpoints
    assert_consistent_last_checkpoint(job, f"long job {job_id}")
    metrics = alice_api.get(f"/api/jobs/{job_id}/events/?types=metrics&limit=5000").json()["events"]
    assert sorted({e["step"] for e in metrics if "time/rollout" in e["data"]}) == list(range(1, LONG + 1))


@pytest.mark.stress
@pytest.mark.timeout(5400)
def test_the_lifecycle_holds_on_the_demos_sqlite(tmp_path: Path) -> None:
    """This module's tests again, in a child session whose database and worker use the demo's SQLite settings."""
    if connection.vendor == "sqlite":
        pytest.skip("this session is the SQLite one")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update({"DATABASE_URL": f"sqlite:///{tmp_path / 'webapp.sqlite3'}",
                "AGENTFLY_REDIS_PREFIX": f"agentfly-test-{uuid.uuid4().hex[:8]}:"})  # its own queues and groups
    # Every moment four times on SQLite (the 50-cancel stress runs on PostgreSQL above); the long job's
    # 300 steps are what contend on SQLite's single writer.
    env.setdefault("AGENTFLY_STRESS_CANCELS", "20")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-x", "-q", "-s", "--timeout", "5000",
         f"{Path(__file__).relative_to(ROOT)}", "-k", "not holds_on_the_demos_sqlite"],
        cwd=ROOT, env=env, capture_output=True, text=True)
    print(*(line for line in done.stdout.splitlines() if "AGENTFLY_STRESS_SEED" in line), sep="\n")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "2 passed" in done.stdout, done.stdout[-3000:]
