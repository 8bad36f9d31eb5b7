"""The worker's side of a job: claim, beat, record progress and checkpoints, finish; and the stale-job sweep.

``webapp.jobs.tasks`` calls these from the worker (and from beat); ``webapp.jobs.actions`` holds what users
do (launch, cancel, resume). Each transition is a conditional UPDATE on the job row (see ``models``) that
writes a ``status`` event (stored, then announced to ``job-<id>`` on commit). Nothing here imports the tasks
or the user-side actions, so the two sides never import each other.
"""

from __future__ import annotations

import logging
import os
import re
import socket
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal, cast

from django.conf import settings
from django.db import DataError, transaction
from django.db.models import Value
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from trainer import events
from trainer.events import JobState, LogLevel
from webapp.jobs.models import WAITING, Checkpoint, Kind, Status, TrainingJob, quotas_of
from webapp.monitor.events import append_events
from webapp.registry.models import Entry, Version
from webapp.registry.worker import record_description

log = logging.getLogger(__name__)


def status_event(job: TrainingJob | int, status: str, message: str = "", *, level: LogLevel | None = None) -> None:
    """Store a job's ``status`` event at its current step (the user-side actions write theirs through this too)."""
    if isinstance(job, int):
        job_id, step = job, TrainingJob.objects.filter(pk=job).values_list("step", flat=True).first() or 0
    else:
        job_id, step = job.pk, job.step
    append_events(job_id, [events.status_event(step, cast(JobState, str(status)), message, level=level)])


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def claim_job(job_id: int) -> bool:
    """Move a queued job to running for this worker. False when someone else has it, or it was cancelled:
    a redelivered message or a revoked-too-late task then returns without doing anything."""
    now = timezone.now()
    with transaction.atomic():
        # A preempted job is claimed like a queued one; it keeps the start of its first run.
        claimed = TrainingJob.objects.filter(pk=job_id, status__in=WAITING, cancel_requested=False).update(
            status=Status.RUNNING, started_at=Coalesce("started_at", Value(now)), run_started_at=now,
            heartbeat_at=now, worker=worker_name(), yield_requested=False
        )
        if claimed:
            status_event(job_id, Status.RUNNING, message=f"claimed by worker {worker_name()}")
    return bool(claimed)


# ------------------------------------------------------------------------------------ quotas and fair share
def seconds_used(job: TrainingJob, now: datetime | None = None) -> float:
    """The job's running time over all its runs: earlier runs (``run_seconds``) and the current one."""
    now = now or timezone.now()
    current = (now - job.run_started_at).total_seconds() if job.run_started_at else 0.0
    return job.run_seconds + current


def over_time(job_id: int) -> str | None:
    """Why the running job must stop now for its team's time quota, or None."""
    job = TrainingJob.objects.filter(pk=job_id, status=Status.RUNNING).select_related("team").first()
    if job is None:
        return None
    limit = quotas_of(job.team_id).max_seconds
    used = seconds_used(job)
    if used <= limit:
        return None
    return (f"the job ran {used:.0f} s, past team {job.team.name}'s quota of {limit} s per job (max_seconds); "
            "its last checkpoint is kept: resume it to continue, or ask an operator to raise the team's quota")


def must_yield(job_id: int, first_step_at: datetime | None, now: datetime | None = None) -> bool:
    """Whether the running job should yield its worker: it has trained for longer than the time slice
    (``AGENTFLY_TIME_SLICE``) since its current run's first step (``first_step_at``; None, no step yet, never
    yields), and another team's job has waited on its queue for longer than a couple of heartbeats (a free
    worker would have taken it by then). Counting from the first step, not from the run's start, keeps two
    teams' jobs whose start-up outlasts the slice from handing the worker back and forth with neither
    training. Only RL jobs on one host yield: they resume exactly from a checkpoint (a warm start has no
    resume, and a multi-node job's other hosts would idle)."""
    slice_s = float(settings.AGENTFLY_TIME_SLICE)
    if slice_s <= 0 or first_step_at is None:
        return False
    now = now or timezone.now()
    job = TrainingJob.objects.filter(pk=job_id, status=Status.RUNNING, cancel_requested=False).first()
    if job is None or job.run_started_at is None or job.kind != Kind.RL or job.nodes > 1:
        return False
    if (now - first_step_at).total_seconds() < slice_s:
        return False
    waited = now - timedelta(seconds=max(1.0, 2 * settings.JOB_HEARTBEAT_SECONDS))
    return (TrainingJob.objects.filter(status__in=WAITING, queue=job.queue, cancel_requested=False,
                                       queued_at__lt=waited).exclude(team_id=job.team_id).exists())


def mark_yielding(job_id: int) -> None:
    """The running job stops at its next step to yield its worker: the pages say so until it is preempted."""
    if not TrainingJob.objects.filter(pk=job_id, status=Status.RUNNING).update(yield_requested=True):
        return
    step = TrainingJob.objects.filter(pk=job_id).values_list("step", flat=True).first() or 0
    append_events(job_id, [events.log_event(step, "yielding: the job stops at its next step and goes back to its "
                                               "queue, so that another team's waiting job can have the worker "
                                               "(fair share); it resumes from that checkpoint")])


def preempt_job(job_id: int, step: int, enqueue: Callable[[TrainingJob], None]) -> Status | None:
    """Put a job that yielded back in its queue to resume from its last checkpoint, and say what the run
    ends as: ``PREEMPTED``; ``CANCELLED`` when a cancel is pending (a cancel that landed after the trainer's
    last look at its flag stopped the same run as the yield: the user asked for it, so it ends cancelled, with
    its checkpoints); ``FAILED`` when it has no checkpoint to resume from; None when it is no longer running.
    Nothing changes but for ``PREEMPTED``."""
    now = timezone.now()
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().filter(pk=job_id, status=Status.RUNNING).first()
        if job is None:
            return None
        if job.cancel_requested:
            return Status.CANCELLED
        checkpoint = job.last_checkpoint
        if checkpoint is None:
            return Status.FAILED
        TrainingJob.objects.filter(pk=job_id).update(
            status=Status.PREEMPTED, resume_from=checkpoint.path, queued_at=now, yield_requested=False,
            run_seconds=seconds_used(job, now), run_started_at=None, worker="", step=Greatest("step", step),
        )
        status_event(job_id, Status.PREEMPTED, message=(
            f"preempted at step {checkpoint.step} after {seconds_used(job, now):.0f} s of running, so that another "
            f"team's job can have the worker (fair share, AGENTFLY_TIME_SLICE); queued to resume from "
            f"{checkpoint.path}"))
        job.refresh_from_db()
        transaction.on_commit(lambda: enqueue(job))
    return Status.PREEMPTED


def beat(job_id: int) -> bool:
    """Stamp the job as alive; return whether the worker should stop after this step: a cancel was
    requested, or the job is no longer running (it was deleted, or swept during a long stall), in which
    case training on would only write checkpoints nobody records."""
    alive = TrainingJob.objects.filter(pk=job_id, status=Status.RUNNING).update(heartbeat_at=timezone.now())
    return not alive or TrainingJob.objects.filter(pk=job_id, cancel_requested=True).exists()


def record_progress(job_id: int, step: int) -> None:
    TrainingJob.objects.filter(pk=job_id, status=Status.RUNNING).update(step=step, heartbeat_at=timezone.now())


def record_checkpoint(job_id: int, step: int, path: str, metrics: dict[str, Any] | None = None) -> Checkpoint:
    """Record a checkpoint the worker wrote, and forget the ones the trainer has since pruned (it keeps the
    last few), so every row points at files that exist and resume never picks a deleted one."""
    checkpoint, _ = Checkpoint.objects.update_or_create(
        job_id=job_id, step=step, defaults={"path": path, "metrics": metrics or {}}
    )
    gone = [c.pk for c in Checkpoint.objects.filter(job_id=job_id).exclude(pk=checkpoint.pk)
            if not Path(c.path).exists()]
    Checkpoint.objects.filter(pk__in=gone).delete()
    return checkpoint


def finish_job(job_id: int, status: str, *, error: str = "", final_metrics: dict[str, Any] | None = None,
               step: int = 0) -> str | None:
    """End a running job; return the status it ended with, or None if it was no longer running.

    A run that completed while a cancel was pending (the cancel landed during the final evaluation or
    checkpoint, after the trainer's last look at the flag) ends ``cancelled``: the user asked for it, and
    every cancel must end the same way. The row is locked first, so a cancel that arrives after this
    decision finds the job finished and changes nothing.
    """
    if status not in (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED):
        raise ValueError(f"Unknown final status: {status!r}")
    error = clean_text(error, 20000)
    try:
        return _finish(job_id, status, error, final_metrics, step)
    except (DataError, ValueError) as exc:
        # What the job reported cannot be stored (a NUL byte in its metrics, which PostgreSQL refuses): end
        # it without them rather than leave it "running".
        log.warning("job %d: its final metrics could not be stored (%s); ending it without them", job_id, exc)
        note = clean_text(f"its final metrics could not be stored: {exc}", 500)
        return _finish(job_id, status, f"{error}; {note}" if error else note, {}, step)


def clean_text(text: str, limit: int) -> str:
    """``text`` as a job's error may quote it (its output, its own message): NUL and other control characters
    removed (PostgreSQL refuses NUL, a terminal obeys escapes), newlines and tabs kept, at most the last
    ``limit`` characters."""
    return CONTROL.sub("", text)[-limit:]


CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _finish(job_id: int, status: str, error: str, final_metrics: dict[str, Any] | None, step: int) -> str | None:
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().filter(pk=job_id, status=Status.RUNNING).first()
        if job is None:
            return None
        if status == Status.SUCCEEDED and job.cancel_requested:
            status = Status.CANCELLED
        TrainingJob.objects.filter(pk=job_id).update(
            status=status, error=error, final_metrics=final_metrics or {}, finished_at=timezone.now(),
            step=Greatest("step", step), yield_requested=False,
        )
        status_event(job_id, status, error, level="error" if error else None)
    return status


def record_versions_used(job_id: int, found: list[tuple[str, str, Any]]) -> list[str]:
    """Record the exact versions the worker imported: ``found`` is ``(kind, import_path, Description)``.

    Returns a warning per tool or reward whose source differs from the version chosen at launch.
    """
    job = TrainingJob.objects.select_related("team").get(pk=job_id)
    warnings: list[str] = []
    tool_versions: list[Version] = []
    launched = {v.entry_id: v for v in job.tool_versions.all()}
    if job.reward_version_id:
        launched[job.reward_version.entry_id] = job.reward_version  # type: ignore[union-attr,assignment]  # its id is set
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


def sweep_stale_jobs(now: datetime | None = None) -> list[int]:
    """End running jobs whose worker stopped beating for longer than ``JOB_HEARTBEAT_TIMEOUT``; return their ids.

    A job nobody asked to stop becomes ``failed`` (its worker probably died). A job with a pending cancel
    becomes ``cancelled``, never failed: the user asked it to stop and it has stopped; its worker may have
    died while finishing (the final evaluation and checkpoint come after the cancel is seen). The update
    repeats the staleness condition, so a worker that beats again between our read and our write keeps its
    job. The job keeps its checkpoints; ``resume`` continues from the last one.
    """
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.JOB_HEARTBEAT_TIMEOUT)
    ended = []
    level: Literal["info", "warning", "error"] | None
    for job in TrainingJob.objects.filter(status=Status.RUNNING, heartbeat_at__lt=cutoff):
        checkpoint = job.last_checkpoint
        silent = (f"the worker {job.worker or '?'} stopped sending heartbeats (last at "
                  f"{job.heartbeat_at:%Y-%m-%d %H:%M:%S} UTC)")
        resume = (f"The last checkpoint is step {checkpoint.step}; resume the job to continue from it."
                  if checkpoint else "No checkpoint was written; launch the job again.")
        if job.cancel_requested:
            status, error, message, level = Status.CANCELLED, "", f"cancelled; {silent} after the cancel. {resume}", None
        else:
            error = f"{silent}; it probably died. {resume}"
            status, message, level = Status.FAILED, error, "error"
        with transaction.atomic():
            if TrainingJob.objects.filter(pk=job.pk, status=Status.RUNNING, heartbeat_at__lt=cutoff).update(
                status=status, error=error, finished_at=now
            ):
                status_event(job, status, message, level=level)
                ended.append(job.pk)
    return ended
