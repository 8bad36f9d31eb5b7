"""State changes of training jobs: launch, cancel, resume, and the worker's claim/beat/finish.

Views and the API parse input and call one of these. Each transition is a conditional UPDATE on the job
row (see ``models``), writes a ``status`` event (stored, then announced to ``job-<id>`` on commit) and
enqueues or revokes Celery work only after the transaction commits, so a worker never looks for a row
that is not there yet.
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from webapp.accounts.models import Team
from webapp.jobs.models import Checkpoint, Status, TrainingJob
from webapp.monitor.events import append_events
from webapp.registry.models import Version

log = logging.getLogger(__name__)


def task_id_for(job_id: int) -> str:
    """The Celery task id of a job's run: known before it is sent, so cancel can always revoke it."""
    return f"agentfly-job-{job_id}"


def _status_event(job: TrainingJob | int, status: str, **extra: Any) -> None:
    job_id = job if isinstance(job, int) else job.pk
    append_events(job_id, [{"type": "status", "state": status, **extra}])


# ----------------------------------------------------------------------------------------- user actions
def do_launch_job(
    *, user: object, team: Team, name: str, config: dict[str, Any], queue: str,
    tool_versions: list[Version], reward_version: Version | None, resources: dict[str, Any] | None = None,
    launch_key: str = "", resumed_from: Checkpoint | None = None,
) -> tuple[TrainingJob, bool]:
    """Create a queued job and send it to its queue; return ``(job, created)``.

    With a ``launch_key`` the launch is idempotent: the same key for the same team returns the job the
    first call created (a double-clicked button, a retried API request), and queues nothing new.
    """
    if not team.has_member(user):
        raise PermissionError("you can only launch jobs for a team you belong to")
    if launch_key:
        existing = TrainingJob.objects.filter(team=team, launch_key=launch_key).first()
        if existing is not None:
            return existing, False
    try:
        with transaction.atomic():
            job = TrainingJob.objects.create(
                team=team, created_by=user, name=name, config=config, queue=queue, launch_key=launch_key,
                reward_version=reward_version, resumed_from=resumed_from,
                total_steps=int(config.get("steps", 0)), celery_task_id="",
            )
            job.config = {**config, "resources": resources or {}}
            job.celery_task_id = task_id_for(job.pk)
            job.save(update_fields=["config", "celery_task_id"])
            job.tool_versions.set(tool_versions)
            _status_event(job, Status.QUEUED)
            transaction.on_commit(lambda: enqueue(job))
    except IntegrityError:
        # Two requests with one key raced past the lookup above; the other one's job is the answer.
        if not launch_key:
            raise
        return TrainingJob.objects.get(team=team, launch_key=launch_key), False
    return job, True


def enqueue(job: TrainingJob) -> None:
    from webapp.jobs.tasks import run_job

    run_job.apply_async(args=[job.pk], queue=job.queue, task_id=job.celery_task_id or task_id_for(job.pk))


def do_cancel_job(job: TrainingJob) -> TrainingJob:
    """Cancel a job. Queued: it ends now. Running: the worker sees the flag between steps and stops.
    Finished: nothing happens (cancel is idempotent)."""
    with transaction.atomic():
        now = timezone.now()
        if TrainingJob.objects.filter(pk=job.pk, status=Status.QUEUED).update(
            status=Status.CANCELLED, cancel_requested=True, finished_at=now
        ):
            _status_event(job, Status.CANCELLED, message="cancelled before it started")
        elif TrainingJob.objects.filter(pk=job.pk, status=Status.RUNNING, cancel_requested=False).update(
            cancel_requested=True
        ):
            append_events(job.pk, [{"type": "log", "level": "info",
                                    "message": "cancel requested; the job stops after the current step"}])
        transaction.on_commit(lambda: revoke(job))
    job.refresh_from_db()
    return job


def revoke(job: TrainingJob) -> None:
    """Revoke the Celery task so a message still in the queue (or redelivered) is dropped. A running task is
    not killed: it stops itself between steps, which keeps its checkpoint consistent."""
    from webapp.celery import app

    try:
        app.control.revoke(job.celery_task_id or task_id_for(job.pk))
    except Exception:
        log.warning("could not revoke the task of job %s", job.pk, exc_info=True)


class NotResumable(ValueError):
    pass


def do_resume_job(*, user: object, job: TrainingJob) -> tuple[TrainingJob, bool]:
    """Start a new job that continues ``job`` from its last checkpoint; return ``(new_job, created)``.

    Resuming twice returns the first resumed job while it is queued, running or succeeded, so a retried
    click does not train the same continuation twice.
    """
    if job.status not in (Status.FAILED, Status.CANCELLED):
        raise NotResumable(f"job #{job.pk} is {job.status}; only failed or cancelled jobs can be resumed")
    checkpoint = job.last_checkpoint
    if checkpoint is None:
        raise NotResumable(f"job #{job.pk} wrote no checkpoint, so there is nothing to resume from; launch it again")
    return do_launch_job(
        user=user, team=job.team, name=f"{job.name} (resumed)"[:100],
        config={k: v for k, v in job.config.items() if k != "resources"} | {"resume_from": checkpoint.path},
        queue=job.queue, tool_versions=list(job.tool_versions.all()), reward_version=job.reward_version,
        resources=job.config.get("resources") or {}, launch_key=f"resume-{checkpoint.pk}", resumed_from=checkpoint,
    )


# ----------------------------------------------------------------------------------------- worker side
def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def claim_job(job_id: int) -> bool:
    """Move a queued job to running for this worker. False when someone else has it, or it was cancelled:
    a redelivered message or a revoked-too-late task then returns without doing anything."""
    now = timezone.now()
    with transaction.atomic():
        claimed = TrainingJob.objects.filter(pk=job_id, status=Status.QUEUED, cancel_requested=False).update(
            status=Status.RUNNING, started_at=now, heartbeat_at=now, worker=worker_name()
        )
        if claimed:
            _status_event(job_id, Status.RUNNING, message=f"claimed by worker {worker_name()}")
    return bool(claimed)


def beat(job_id: int) -> bool:
    """Stamp the job as alive; return whether the worker should stop after this step: a cancel was
    requested, or the job is no longer running (the sweeper failed it during a long stall, or it was
    deleted), in which case training on would only write checkpoints nobody records."""
    alive = TrainingJob.objects.filter(pk=job_id, status=Status.RUNNING).update(heartbeat_at=timezone.now())
    return not alive or TrainingJob.objects.filter(pk=job_id, cancel_requested=True).exists()


def record_progress(job_id: int, step: int) -> None:
    TrainingJob.objects.filter(pk=job_id, status=Status.RUNNING).update(step=step, heartbeat_at=timezone.now())


def record_checkpoint(job_id: int, step: int, path: str, metrics: dict[str, Any] | None = None) -> Checkpoint:
    """Record a checkpoint the worker wrote, and forget the ones the trainer has since pruned (it keeps the
    last few), so every row points at files that exist and resume never picks a deleted one."""
    from pathlib import Path

    checkpoint, _ = Checkpoint.objects.update_or_create(
        job_id=job_id, step=step, defaults={"path": path, "metrics": metrics or {}}
    )
    gone = [c.pk for c in Checkpoint.objects.filter(job_id=job_id).exclude(pk=checkpoint.pk)
            if not Path(c.path).exists()]
    Checkpoint.objects.filter(pk__in=gone).delete()
    return checkpoint


def finish_job(job_id: int, status: str, *, error: str = "", final_metrics: dict[str, Any] | None = None) -> bool:
    """End a running job. False if it was no longer running (the sweeper failed it first)."""
    if status not in (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED):
        raise ValueError(f"Unknown final status: {status!r}")
    with transaction.atomic():
        done = TrainingJob.objects.filter(pk=job_id, status=Status.RUNNING).update(
            status=status, error=error, final_metrics=final_metrics or {}, finished_at=timezone.now()
        )
        if done:
            _status_event(job_id, status, **({"message": error, "level": "error"} if error else {}))
    return bool(done)


def record_versions_used(job_id: int, found: list[tuple[str, str, Any]]) -> list[str]:
    """Record the exact versions the worker imported: ``found`` is ``(kind, import_path, Description)``.

    Returns a warning per tool or reward whose source differs from the version chosen at launch.
    """
    from webapp.registry.actions import record_description
    from webapp.registry.models import Entry

    job = TrainingJob.objects.select_related("team").get(pk=job_id)
    warnings: list[str] = []
    tool_versions: list[Version] = []
    launched = {v.entry_id: v for v in job.tool_versions.all()}
    if job.reward_version_id:
        launched[job.reward_version.entry_id] = job.reward_version  # type: ignore[union-attr]
    for kind, path, description in found:
        entry = (Entry.objects.filter(kind=kind, import_path=path, team=job.team).first()
                 or Entry.objects.filter(kind=kind, import_path=path, team__isnull=True).first())
        if entry is None:
            continue
        before = launched.get(entry.pk)
        version = record_description(entry.pk, description)
        if version is None:
            continue
        if before is not None and before.source_hash != version.source_hash:
            warnings.append(f"{kind} {path} changed since launch ({before.short_hash} -> {version.short_hash}); "
                            "the job runs and records the new version")
        if kind == "tool":
            tool_versions.append(version)
        else:
            TrainingJob.objects.filter(pk=job_id).update(reward_version=version)
    if tool_versions:
        job.tool_versions.set(tool_versions)
    return warnings


def fail_stale_jobs(now: Any = None) -> list[int]:
    """Fail running jobs whose worker stopped beating for longer than ``JOB_HEARTBEAT_TIMEOUT``.

    The update repeats the staleness condition, so a worker that beats again between our read and our write
    keeps its job. The job keeps its checkpoints; ``resume`` continues from the last one.
    """
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.JOB_HEARTBEAT_TIMEOUT)
    failed = []
    for job in TrainingJob.objects.filter(status=Status.RUNNING, heartbeat_at__lt=cutoff):
        checkpoint = job.last_checkpoint
        error = (f"the worker {job.worker or '?'} stopped sending heartbeats (last at "
                 f"{job.heartbeat_at:%Y-%m-%d %H:%M:%S} UTC); it probably died. ")
        error += (f"The last checkpoint is step {checkpoint.step}; resume the job to continue from it."
                  if checkpoint else "No checkpoint was written; launch the job again.")
        with transaction.atomic():
            if TrainingJob.objects.filter(pk=job.pk, status=Status.RUNNING, heartbeat_at__lt=cutoff).update(
                status=Status.FAILED, error=error, finished_at=now
            ):
                _status_event(job.pk, Status.FAILED, message=error, level="error")
                failed.append(job.pk)
    return failed

