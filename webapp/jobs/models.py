"""``TrainingJob``: one run of the trainer on a worker, and the checkpoints it wrote.

The state machine is ``queued -> running -> succeeded | failed | cancelled`` (``queued -> cancelled`` too),
and ``running -> preempted -> running`` when a job yields its worker to another team's (fair share).
Every transition is a conditional UPDATE (``WHERE status IN (...)``), so two processes racing over one job
(a worker finishing it while a user cancels it, a redelivered message, the stale-job sweeper) cannot both
win: exactly one update matches, the other sees 0 rows and backs off.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.db.models.functions import Coalesce
from django.urls import reverse
from django.utils import timezone

from trainer.events import RUN_STATES
from webapp.accounts.models import Team, TeamOwnedQuerySet
from webapp.registry.models import Version

# A job's states are the trainer's run states (``trainer.events.RUN_STATES``): one vocabulary for both, and
# one of the web app's own: ``preempted``, a job that yielded its worker to another team's job at a
# checkpoint and waits in the queue to resume from it (fair share, ``webapp.jobs.worker.preempt_job``).
Status = models.TextChoices("Status", [*((state.upper(), state) for state in RUN_STATES),  # type: ignore[call-overload]
                                       ("PREEMPTED", ("preempted", "preempted, queued"))])


ACTIVE = (Status.QUEUED, Status.RUNNING, Status.PREEMPTED)
WAITING = (Status.QUEUED, Status.PREEMPTED)
FINISHED = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)


class Queue(models.TextChoices):
    CPU = "cpu", "CPU"
    GPU = "gpu", "GPU"


class Kind(models.TextChoices):
    """What a job trains: RL, a supervised warm start (``trainer.sft``), or the warm start and then RL from
    its weights (one job, two phases: SFT's steps, then RL's, counted on from there)."""

    RL = "rl", "RL"
    SFT = "sft", "SFT"
    SFT_THEN_RL = "sft_then_rl", "SFT then RL"


def kind_choices_text() -> str:
    """The kinds as a user types them: ``rl, sft or sft_then_rl``."""
    values = [str(v) for v in Kind.values]
    return f"{', '.join(values[:-1])} or {values[-1]}"


class JobQuerySet(TeamOwnedQuerySet["TrainingJob"]):
    pass


class TrainingJob(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="jobs")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL,
                                   related_name="jobs")
    name = models.CharField(max_length=100)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED, db_index=True)
    queue = models.CharField(max_length=10, choices=Queue.choices, default=Queue.CPU)
    kind = models.CharField(max_length=12, choices=Kind.choices, default=Kind.RL,
                            help_text="rl, sft (a warm start), or sft_then_rl (RL from the warm start's weights).")
    config = models.JSONField(help_text="The validated trainer configuration the worker runs "
                              "(trainer.config.Config's keys, and its pools' resources).")
    # The job's own launch fields, beside the trainer's config rather than in it: the worker reads them.
    ranks = models.PositiveSmallIntegerField(default=1, help_text="Ranks per node (GPUs, or CPU processes): more "
                                             "than 1 runs a torchrun process group.")
    nodes = models.PositiveSmallIntegerField(default=1, help_text="Hosts the job's ranks run on, one worker each.")
    resume_from = models.CharField(max_length=1000, blank=True, help_text="The checkpoint the job continues "
                                   "from (a resume, or a preempted job's next run); empty: it starts afresh.")
    tool_versions = models.ManyToManyField(Version, blank=True, related_name="jobs_as_tool")
    reward_version = models.ForeignKey(Version, null=True, blank=True, on_delete=models.PROTECT,
                                       related_name="jobs_as_reward")
    launch_key = models.CharField(max_length=64, blank=True,
                                  help_text="Client-chosen key that makes a repeated launch return the same job.")
    resumed_from = models.ForeignKey("Checkpoint", null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="resumed_by")
    worker = models.CharField(max_length=200, blank=True, help_text="hostname:pid of the worker running it.")
    cancel_requested = models.BooleanField(default=False)
    yield_requested = models.BooleanField(default=False, help_text="Running, and stopping at its next step to "
                                          "yield its worker to another team's job (fair share): the page says "
                                          "'yielding' until it is preempted.")
    step = models.PositiveIntegerField(default=0)
    final_metrics = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    last_seq = models.PositiveBigIntegerField(default=0, help_text="Sequence number of the newest stored event.")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    queued_at = models.DateTimeField(null=True, blank=True, help_text="When it last joined its queue (launch or "
                                     "preemption): how long another team has waited for a worker.")
    run_started_at = models.DateTimeField(null=True, blank=True, help_text="When its current run began (its "
                                          "latest claim): the time slice counts from here.")
    run_seconds = models.FloatField(default=0.0, help_text="Running time of its earlier runs (before preemptions); "
                                    "counted against the team's time quota.")

    objects = JobQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["team", "launch_key"], condition=~models.Q(launch_key=""),
                                    name="job_unique_launch_key"),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.name}"

    def get_absolute_url(self) -> str:
        return reverse("jobs:detail", args=[self.pk])

    # Derived, never stored: a stored copy could disagree with what it is derived from.
    @property
    def celery_task_id(self) -> str:
        """The Celery task id of the job's run: known before it is sent, so cancel can always revoke it."""
        return f"agentfly-job-{self.pk}"

    @property
    def sft_steps(self) -> int:
        """The warm start's optimizer steps (``trainer.config.SFTConfig.total_steps``); 0 for an RL job. An
        sft_then_rl job's RL steps are counted after them."""
        if self.kind == Kind.RL or not isinstance(self.config, dict):
            return 0
        from trainer.config import ConfigError, SFTConfig, from_dict

        try:
            return int(from_dict(SFTConfig, self.config.get("sft") or {}, "sft.").total_steps)
        except ConfigError:  # a config written behind the API: the worker fails the job with this error
            return 0

    @property
    def total_steps(self) -> int:
        """The step the job trains to: its config's ``steps`` of RL, after the warm start's steps."""
        rl = int(self.config.get("steps", 0)) if isinstance(self.config, dict) else 0
        return self.sft_steps + (0 if self.kind == Kind.SFT else rl)

    @property
    def is_stale(self) -> bool:
        """Running, but its worker has not beaten for ``JOB_HEARTBEAT_TIMEOUT``: the beat task's sweep will end
        it (pages show this; reading a job never changes it)."""
        if self.status != Status.RUNNING or self.heartbeat_at is None:
            return False
        return (timezone.now() - self.heartbeat_at).total_seconds() > settings.JOB_HEARTBEAT_TIMEOUT

    def declared_resources(self) -> set[str]:
        """The resources the job's tools and reward declare, as the registry recorded them (a pool each)."""
        versions = [*self.tool_versions.all(), *([self.reward_version] if self.reward_version else [])]
        return {v.resource for v in versions if v.resource}

    @property
    def launch_config(self) -> dict[str, Any]:
        """The config as the API shows it: the trainer's, with the job's own launch fields (ranks and nodes
        above 1, the checkpoint it resumes from) under the keys they are launched with."""
        return {**(self.config if isinstance(self.config, dict) else {}),
                **({"ranks": self.ranks} if self.ranks > 1 else {}),
                **({"nodes": self.nodes} if self.nodes > 1 else {}),
                **({"resume_from": self.resume_from} if self.resume_from else {})}

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED

    @property
    def can_resume(self) -> bool:
        """Failed or cancelled with a checkpoint to continue from, and not a warm start, which has no resume
        (``actions.do_resume_job``'s rule)."""
        return (self.kind != Kind.SFT and self.status in (Status.FAILED, Status.CANCELLED)
                and self.checkpoints.exists())

    @property
    def duration(self) -> float | None:
        if self.started_at is None:
            return None
        end = self.finished_at or timezone.now()
        return (end - self.started_at).total_seconds()

    # ------------------------------------------------------------------ the state a person sees, and its actions
    @property
    def phase(self) -> str:
        """The job's state as the pages say it (one of ``PHASES``): its status, refined by what is pending (a
        cancel, a yield) and by what came after it (a failed or cancelled job that was resumed)."""
        if self.status == Status.RUNNING:
            return "cancelling" if self.cancel_requested else "yielding" if self.yield_requested else "running"
        if self.status in (Status.FAILED, Status.CANCELLED) and self.continued_by is not None:
            return "resumed"
        return str(self.status)

    @property
    def phase_label(self) -> str:
        return PHASE_LABELS[self.phase]

    @functools.cached_property
    def continued_by(self) -> TrainingJob | None:
        """The job that resumed this one from one of its checkpoints (the first, if several did)."""
        return TrainingJob.objects.filter(resumed_from__job=self).order_by("created_at", "id").first()

    @property
    def can_cancel(self) -> bool:
        """Cancel works: the job waits (it ends now) or runs with no cancel pending (it stops at a step)."""
        return self.phase in CANCELLABLE

    @property
    def cancel_question(self) -> str:
        """What the Cancel button asks, true to what a cancel does in the job's state."""
        return self.cancel_question_in(self.phase)

    def cancel_question_in(self, phase: str) -> str:
        """What the Cancel button asks in ``phase`` (the dashboard changes its question as the job moves)."""
        n = f"Cancel job #{self.pk}?"
        if phase == "queued":
            return f"{n} It has not started: it leaves the queue now, and nothing is trained or kept."
        if phase == "preempted":
            ckpt = self.last_checkpoint
            at = f" from step {ckpt.step}" if ckpt is not None else ""
            return (f"{n} It waits in the queue to resume{at}; it ends now, and its checkpoints stay: you can "
                    "still resume it later.")
        return (f"{n} It stops after its current step and saves a checkpoint; you can resume it from its last "
                "checkpoint.")

    def queue_wait(self) -> QueueWait | None:
        """Why a waiting job waits: its place in its queue and what it waits for (a busy worker, its team's
        quota, fair share, or, after a while with nothing running on its queue, a missing worker)."""
        if self.status not in WAITING or self.cancel_requested:
            return None
        key = Coalesce("queued_at", "created_at")
        mine = self.queued_at or self.created_at
        waiting = (TrainingJob.objects.filter(status__in=WAITING, queue=self.queue, cancel_requested=False)
                   .annotate(since=key))
        ahead = waiting.filter(models.Q(since__lt=mine) | models.Q(since=mine, pk__lt=self.pk)).count()
        running = list(TrainingJob.objects.filter(status=Status.RUNNING, queue=self.queue)
                       .select_related("team").order_by("run_started_at")[:5])
        quota = quotas_of(self.team_id).concurrent_jobs
        team_running = TrainingJob.objects.filter(team_id=self.team_id, status=Status.RUNNING).count()
        waited = (timezone.now() - mine).total_seconds()
        reasons: list[str] = []
        if team_running >= quota:
            reasons.append(f"its team's quota: {team_running} of the team's jobs run, at most {quota} at once")
        others = [j for j in running if j.team_id != self.team_id]
        if running:
            names = ", ".join(f"#{j.pk}" for j in running)
            reasons.append(f"a busy worker: {len(running)} job{'s' if len(running) > 1 else ''} ({names}) "
                           f"{'run' if len(running) > 1 else 'runs'} on the {self.queue} queue")
        slice_s = float(settings.AGENTFLY_TIME_SLICE)
        if others and slice_s > 0:
            reasons.append(f"fair share: another team's job yields its worker after {slice_s:.0f} s of training "
                           "when a job of another team waits")
        if ahead:
            reasons.append(f"{ahead} job{'s' if ahead > 1 else ''} queued before it")
        return QueueWait(place=ahead + 1, waiting=waiting.count(), reasons=reasons,
                         no_worker=not running and waited > 30)

    @property
    def progress(self) -> int:
        return int(100 * self.step / self.total_steps) if self.total_steps else 0

    @property
    def last_checkpoint(self) -> Checkpoint | None:
        return self.checkpoints.order_by("-step").first()

    def reward_errors(self) -> RewardErrors | None:
        """The rewards that raised, for the banner of the job page and dashboard: the first error and its
        traceback (the trainer logs it once, as a warning), and the share of the newest step's rollouts whose
        reward raised. None when no reward raised."""
        first = (self.events.filter(type="log", data__level="warning", data__has_key="traceback")
                 .order_by("seq").first())
        if first is None:
            return None
        latest = (self.events.filter(type="metrics", data__has_key="reward_errors/fraction")
                  .order_by("-seq").values_list("step", "data").first())
        share, step = (None, None) if latest is None else (latest[1].get("reward_errors/fraction"), latest[0])
        return RewardErrors(message=str(first.data.get("message", "")), traceback=str(first.data["traceback"]),
                            first_step=first.step, share=share if isinstance(share, (int, float)) else None,
                            step=step)

    def summary(self) -> dict[str, Any]:
        return {"id": self.pk, "status": self.status, "step": self.step, "total_steps": self.total_steps,
                "cancel_requested": self.cancel_requested, "phase": self.phase}


# What the pages call each state (``TrainingJob.phase``), and the states a Cancel works in.
PHASE_LABELS = {**{str(v): str(label) for v, label in Status.choices}, "preempted": "Preempted, queued",
                "yielding": "Yielding", "cancelling": "Cancelling", "resumed": "Resumed"}
PHASES = tuple(PHASE_LABELS)
CANCELLABLE = ("queued", "running", "yielding", "preempted")


@dataclass(frozen=True)
class RewardErrors:
    message: str  # the trainer's warning: the share of the first step whose rewards raised, and the error
    traceback: str
    first_step: int | None
    share: float | None  # of the newest step's rollouts whose reward raised (0-1)
    step: int | None  # that step

    @property
    def percent(self) -> str:
        return "" if self.share is None else f"{self.share:.0%}"


@dataclass(frozen=True)
class QueueWait:
    place: int  # 1: next to be taken
    waiting: int  # jobs waiting on the queue, this one included
    reasons: list[str]
    no_worker: bool  # nothing runs on its queue and it has waited a while: likely no worker listens


class Checkpoint(models.Model):
    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="checkpoints")
    step = models.PositiveIntegerField()
    path = models.CharField(max_length=500)
    metrics = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["job", "-step"]
        constraints = [models.UniqueConstraint(fields=["job", "step"], name="checkpoint_unique_step")]

    def __str__(self) -> str:
        return f"job {self.job_id} step {self.step}"


class TeamQuota(models.Model):
    """An operator's quotas for one team; a field left empty takes the server's default (the
    ``AGENTFLY_QUOTA_*`` settings). Only superusers edit these (the admin)."""

    team = models.OneToOneField(Team, on_delete=models.CASCADE, related_name="quota")
    concurrent_jobs = models.PositiveIntegerField(null=True, blank=True,
                                                  help_text="Jobs queued, running or preempted at once.")
    max_steps = models.PositiveIntegerField(null=True, blank=True, help_text="Total steps of one job.")
    max_seconds = models.PositiveIntegerField(null=True, blank=True,
                                              help_text="Running time of one job, over all its runs, in seconds.")

    def __str__(self) -> str:
        return f"quotas of {self.team}"


API_NAME = RegexValidator(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
                          "A resource name: letters, digits, '_', '.' and '-', starting with a letter or digit.")


class APIQuota(models.Model):
    """The operator's limits on one rate-limited API for one team: every job of the team that uses the API
    (``resources.<api>`` in its config, or a chosen tool's resource of that name) draws on one budget in
    Redis (``webapp.jobs.apis``), within these limits; a job's config may lower them, never raise them. A job
    that uses an API its team has no quota for is refused. Only superusers edit these (the admin): a team's
    staff could otherwise raise its own share of a provider that other teams share."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="api_quotas")
    api = models.CharField(max_length=100, validators=[API_NAME],
                           help_text="The resource name a job's config uses for the API (resources.<name>), "
                                     "e.g. search.")
    rate = models.FloatField(help_text="Requests per second, over all of the team's jobs together.")
    burst = models.PositiveIntegerField(default=1, help_text="Requests that may go at once after a quiet spell.")
    concurrency = models.PositiveIntegerField(default=4, help_text="Requests in flight at once.")
    daily_quota = models.PositiveIntegerField(default=0, help_text="Requests per UTC day; 0 = no daily limit.")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["team", "api"]
        verbose_name = "API quota"
        constraints = [
            models.UniqueConstraint(fields=["team", "api"], name="apiquota_one_per_team_and_api"),
            models.CheckConstraint(condition=models.Q(rate__gt=0) & models.Q(burst__gte=1)
                                   & models.Q(concurrency__gte=1), name="apiquota_limits_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.api} of {self.team}"

    @property
    def rate_text(self) -> str:
        return f"{self.rate:g}"

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        from agentfly.resources.builtin import BUILTIN_SPECS
        from trainer.config import RESOURCE_BACKEND_KEYS

        if self.api in BUILTIN_SPECS or self.api in RESOURCE_BACKEND_KEYS:
            raise ValidationError({"api": f"{self.api!r} is a built-in resource or a setting of resources, not an "
                                          "API; name the API as a job's config does (resources.<name>)."})
        if self.rate is not None and self.rate <= 0:
            raise ValidationError({"rate": "The rate must be above 0 requests per second."})
        errors = {f: "At least 1." for f in ("burst", "concurrency") if getattr(self, f) is not None
                  and getattr(self, f) < 1}
        if errors:
            raise ValidationError(errors)


@dataclass(frozen=True)
class Quotas:
    concurrent_jobs: int
    max_steps: int
    max_seconds: int


def quotas_of(team: Team | int) -> Quotas:
    """The team's quotas: its ``TeamQuota`` row where set, the server's defaults elsewhere."""
    team_id = team if isinstance(team, int) else team.pk
    row = TeamQuota.objects.filter(team_id=team_id).first()

    def pick(name: str, default: int) -> int:
        value = getattr(row, name, None) if row is not None else None
        return default if value is None else int(value)

    return Quotas(concurrent_jobs=pick("concurrent_jobs", settings.AGENTFLY_QUOTA_CONCURRENT_JOBS),
                  max_steps=pick("max_steps", settings.AGENTFLY_QUOTA_MAX_STEPS),
                  max_seconds=pick("max_seconds", settings.AGENTFLY_QUOTA_MAX_SECONDS))
