"""What users do to training jobs: launch, cancel, resume.

Views and the API parse input and call one of these. Each transition is a conditional UPDATE on the job
row (see ``models``), writes a ``status`` event (stored, then announced to ``job-<id>`` on commit) and
enqueues or revokes Celery work only after the transaction commits, so a worker never looks for a row
that is not there yet. The worker's side (claim, beat, finish, the stale-job sweep) is ``webapp.jobs.worker``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone

from trainer.events import log_event
from webapp.accounts.models import Team
from webapp.jobs import paths
from webapp.jobs.body import warm_started
from webapp.jobs.models import ACTIVE, WAITING, Checkpoint, Kind, Status, TrainingJob, quotas_of
from webapp.jobs.tasks import run_job
from webapp.jobs.worker import status_event
from webapp.monitor.events import append_events
from webapp.registry.models import Version

if TYPE_CHECKING:
    from django.contrib.auth.models import User

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------- user actions
class QuotaExceeded(PermissionError):
    """A launch past one of its team's quotas; the message names the quota and how to get under it."""


def check_quotas(team: Team, config: dict[str, Any], kind: str, user: User) -> None:
    """Refuse a job past its team's step quota, one more job than its team's concurrent-jobs quota, or one
    more than ``user``'s own over all of their teams (a team of one's own adds no room). The caller holds the
    team's and the user's row locks, so two launches at once cannot both take the last place."""
    quotas = quotas_of(team)
    steps = TrainingJob(config=config, kind=kind).total_steps
    if steps > quotas.max_steps:
        raise QuotaExceeded(f"{steps} steps is over team {team.name}'s quota of {quotas.max_steps} steps per job "
                            "(max_steps); launch fewer steps, or ask an operator to raise the team's quota")
    active = TrainingJob.objects.filter(team=team, status__in=ACTIVE).count()
    if active >= quotas.concurrent_jobs:
        raise QuotaExceeded(f"team {team.name} already has {active} jobs queued or running, its quota of "
                            f"{quotas.concurrent_jobs} concurrent jobs (concurrent_jobs); wait for one to finish or "
                            "cancel one, or ask an operator to raise the team's quota")
    mine = TrainingJob.objects.filter(created_by=user, status__in=ACTIVE).count()
    if mine >= settings.AGENTFLY_QUOTA_USER_CONCURRENT_JOBS:
        raise QuotaExceeded(f"you already have {mine} jobs queued or running over all your teams, the quota of "
                            f"{settings.AGENTFLY_QUOTA_USER_CONCURRENT_JOBS} per person "
                            "(AGENTFLY_QUOTA_USER_CONCURRENT_JOBS); wait for one to finish or cancel one, or ask "
                            "an operator to raise it")


def do_launch_job(
    *, user: object, team: Team, name: str, config: dict[str, Any], queue: str,
    tool_versions: list[Version], reward_version: Version | None, resources: dict[str, Any] | None = None,
    launch_key: str = "", resumed_from: Checkpoint | None = None, kind: str = Kind.RL, ranks: int = 1,
    nodes: int = 1,
) -> tuple[TrainingJob, bool]:
    """Create a queued job and send it to its queue; return ``(job, created)``.

    With a ``launch_key`` the launch is idempotent: the same key for the same team returns the job the
    first call created (a double-clicked button, a retried API request), and queues nothing new. A launch
    past a team quota raises ``QuotaExceeded``.
    """
    if not team.has_member(user):
        raise PermissionError("you can only launch jobs for a team you belong to")
    if launch_key:
        existing = TrainingJob.objects.filter(team=team, launch_key=launch_key).first()
        if existing is not None:
            return existing, False
    try:
        with transaction.atomic():
            # The user's row, then the team's: every launch takes them in this order, so none waits on another
            # in a circle, and a user's launches into two teams at once count each other.
            get_user_model().objects.select_for_update().filter(pk=user.pk).first()
            Team.objects.select_for_update().filter(pk=team.pk).first()
            check_quotas(team, config, kind, user)
            job = TrainingJob.objects.create(
                team=team, created_by=user, name=name, queue=queue, launch_key=launch_key, kind=kind,
                reward_version=reward_version, resumed_from=resumed_from, queued_at=timezone.now(),
                config={**config, "resources": resources or {}}, ranks=ranks, nodes=nodes,
                resume_from=resumed_from.path if resumed_from is not None else "",
            )
            job.tool_versions.set(tool_versions)
            status_event(job, Status.QUEUED)
            transaction.on_commit(lambda: enqueue(job))
    except IntegrityError:
        # Two requests with one key raced past the lookup above; the other one's job is the answer.
        if not launch_key:
            raise
        return TrainingJob.objects.get(team=team, launch_key=launch_key), False
    return job, True


def enqueue(job: TrainingJob) -> None:
    run_job.apply_async(args=[job.pk], queue=job.queue, task_id=job.celery_task_id)


def do_cancel_job(job: TrainingJob) -> TrainingJob:
    """Cancel a job. Queued: it ends now. Running: the worker sees the flag between steps and stops.
    Finished: nothing happens (cancel is idempotent)."""
    with transaction.atomic():
        now = timezone.now()
        if TrainingJob.objects.filter(pk=job.pk, status__in=WAITING).update(
            status=Status.CANCELLED, cancel_requested=True, finished_at=now
        ):
            # A preempted job waits in the queue like a new one: it ends now, keeping its checkpoints.
            status_event(job, Status.CANCELLED, message="cancelled before it started" if job.status == Status.QUEUED
                         else "cancelled while preempted; resume it to continue from its last checkpoint")
        elif TrainingJob.objects.filter(pk=job.pk, status=Status.RUNNING, cancel_requested=False).update(
            cancel_requested=True
        ):
            append_events(job.pk, [log_event(job.step, "cancel requested; the job stops after the current step")])
        transaction.on_commit(lambda: revoke(job))
    job.refresh_from_db()
    return job


def revoke(job: TrainingJob) -> None:
    """Revoke the Celery task so a message still in the queue (or redelivered) is dropped. A running task is
    not killed: it stops itself between steps, which keeps its checkpoint consistent."""
    try:
        run_job.app.control.revoke(job.celery_task_id)
    except Exception:
        log.warning("could not revoke the task of job %s", job.pk, exc_info=True)


class NotResumable(ValueError):
    pass


def do_resume_job(*, user: object, job: TrainingJob) -> tuple[TrainingJob, bool]:
    """Start a new job that continues ``job`` from its last checkpoint; return ``(new_job, created)``.

    Resuming twice returns the first resumed job while it is queued, running or succeeded, so a retried
    click does not train the same continuation twice. The new job keeps the kind: an sft_then_rl job's
    checkpoints are its RL phase's, so its continuation trains RL from the warm start's weights.
    """
    if job.status not in (Status.FAILED, Status.CANCELLED):
        raise NotResumable(f"job #{job.pk} is {job.status}; only failed or cancelled jobs can be resumed")
    if job.kind == Kind.SFT:
        raise NotResumable(f"job #{job.pk} is a warm start (sft), which has no resume; launch it again")
    checkpoint = job.last_checkpoint
    if checkpoint is None:
        raise NotResumable(f"job #{job.pk} wrote no checkpoint, so there is nothing to resume from; launch it again")
    config = {k: v for k, v in job.config.items() if k != "resources"}
    if job.kind == Kind.SFT_THEN_RL:
        config["model"] = warm_started(job.config.get("model") or {}, warm_start_model(job))
    return do_launch_job(
        user=user, team=job.team, name=f"{job.name} (resumed)"[:100], config=config, kind=job.kind,
        queue=job.queue, tool_versions=list(job.tool_versions.all()), reward_version=job.reward_version,
        resources=job.config.get("resources") or {}, launch_key=f"resume-{checkpoint.pk}", resumed_from=checkpoint,
        ranks=job.ranks, nodes=job.nodes,
    )


def warm_start_model(job: TrainingJob) -> str:
    """Where the RL phase of sft_then_rl ``job`` got its weights: the model its warm start saved
    (``<job dir>/sft``, as ``trainer.sft.run_sft`` places it), or, for a job that was itself a resume, the
    model its config already names."""
    if job.resume_from:
        return str((job.config.get("model") or {})["path"])
    return str((job.config.get("sft") or {}).get("output_dir") or paths.job_dir(job) / "sft")


