from __future__ import annotations

import uuid
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from webapp.accounts.throttling import throttle
from webapp.jobs import actions, files
from webapp.jobs.forms import PRESETS, LaunchForm, initial_from_job, preset_initial
from webapp.jobs.models import Status, TrainingJob
from webapp.monitor.models import JobEvent, JobNote


def visible_jobs(request: HttpRequest):  # type: ignore[no-untyped-def]
    return TrainingJob.objects.visible_to(request.user).select_related("team__group", "created_by", "note")


# The job list's sort keys: a column of the row, or a final metric (jobs without it last).
SORTS = {"created": lambda j: j.created_at.timestamp(), "name": lambda j: j.name.lower(), "status": lambda j: j.status,
         "steps": lambda j: j.step}
FINAL_SORTS = ("eval/accuracy", "reward/mean")
# The launch page's "start from an example" bar: (preset, title).
PRESET_LINKS = [(key, preset["title"]) for key, preset in PRESETS.items()]


def job_filters(request: HttpRequest) -> dict[str, str]:
    """The list's filters from the query (``?status=running&task=key_chain&algorithm=grpo&sort=-eval/accuracy``)."""
    return {k: request.GET.get(k, "")[:60] for k in ("q", "status", "task", "algorithm", "tag", "sort")}


def with_tag(jobs: Any, tag: str) -> Any:
    """The jobs tagged ``tag`` (tags are stored lower-case). PostgreSQL asks its JSON containment index;
    SQLite (the demo's database) has no JSON containment lookup, so the team's tagged notes are read and
    matched here: a team's notes are few."""
    tag = " ".join(tag.split()).lower()
    if connection.features.supports_json_field_contains:
        return jobs.filter(note__tags__contains=[tag])
    tagged = JobNote.objects.filter(job__in=jobs.values("pk")).exclude(tags=[]).values_list("job_id", "tags")
    return jobs.filter(pk__in=[job_id for job_id, tags in tagged if isinstance(tags, list) and tag in tags])


@login_required
def job_list(request: HttpRequest) -> HttpResponse:
    f = job_filters(request)
    jobs_qs = visible_jobs(request)
    if f["status"]:
        jobs_qs = jobs_qs.filter(status=f["status"])
    if f["task"]:
        jobs_qs = jobs_qs.filter(config__data__task=f["task"])
    if f["algorithm"]:
        jobs_qs = jobs_qs.filter(config__algorithm__name=f["algorithm"])
    if f["q"].strip():
        jobs_qs = jobs_qs.filter(name__icontains=f["q"].strip())
    if f["tag"]:
        jobs_qs = with_tag(jobs_qs, f["tag"])
    jobs = list(jobs_qs[:200])
    key = f["sort"].lstrip("-")
    if key in SORTS or key in FINAL_SORTS:
        missing = [j for j in jobs if key in FINAL_SORTS and not isinstance((j.final_metrics or {}).get(key), (int, float))]
        ranked = [j for j in jobs if j not in missing]
        ranked.sort(key=SORTS.get(key) or (lambda j: float(j.final_metrics[key])), reverse=f["sort"].startswith("-"))
        jobs = ranked + missing
    seen = visible_jobs(request).values_list("config__data__task", "config__algorithm__name")[:1000]
    context = {"jobs": jobs, "any_active": any(j.is_active for j in jobs), "filters": f,
               "query": request.GET.urlencode(), "statuses": Status.choices,
               "tasks": sorted({t for t, _ in seen if isinstance(t, str)}),
               "algorithms": sorted({a for _, a in seen if isinstance(a, str)}),
               "sorts": [("-created", "newest"), ("created", "oldest"), ("name", "name"), ("status", "state"),
                         ("-eval/accuracy", "best eval accuracy"), ("-reward/mean", "best final reward")]}
    template = "jobs/_job_table.html" if request.headers.get("HX-Request") else "jobs/job_list.html"
    return render(request, template, context)


@login_required
@require_http_methods(["GET", "POST"])
@throttle("launch")
def launch(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        form = LaunchForm(request.POST, user=request.user)
        if form.is_valid():
            try:
                job, created = form.launch(request.user)
            except actions.QuotaExceeded as exc:
                form.add_error(None, str(exc))
            else:
                if created:
                    messages.success(request, f"Job #{job.pk} is queued on the {job.queue} queue.")
                return redirect(job)
        # The presets stay on offer beside the errors: starting again from an example is one way out.
        return render(request, "jobs/launch.html", {"form": form, "presets": PRESET_LINKS, "preset": ""}, status=400)
    initial: dict[str, object] = {"name": "calculator-grpo"}
    clone_of = None
    if request.GET.get("clone", "").isdecimal() and len(request.GET["clone"]) < 18:
        # "Clone job": the form filled in as that job was launched (only a job the user can see).
        clone_of = visible_jobs(request).filter(pk=int(request.GET["clone"])).first()
        if clone_of is None:
            messages.error(request, f"Job #{request.GET['clone']} is not one of your teams' jobs; nothing to clone.")
        else:
            initial = initial_from_job(clone_of)
    elif request.GET.get("preset"):
        preset = preset_initial(request.GET["preset"][:40], request.user)
        if preset is None:
            messages.error(request, f"No preset named {request.GET['preset'][:40]!r}; pick one of {', '.join(PRESETS)}.")
        else:
            initial = preset
    form = LaunchForm(user=request.user, initial={**initial, "launch_key": uuid.uuid4().hex})
    if not form.fields["reward"].queryset.exists():
        messages.warning(request, "No reward is registered yet. Built-ins appear when a worker starts "
                                  "(celery -A webapp worker -Q cpu); or register one in the registry.")
    return render(request, "jobs/launch.html", {"form": form, "clone_of": clone_of, "presets": PRESET_LINKS,
                                                "preset": request.GET.get("preset", "")})


def gateway_endpoint(job: TrainingJob) -> dict[str, str] | None:
    """A running gateway job's endpoint (its URL and job key), from the log event its trainer sent when the
    gateway started: shown to the job's team while it runs; once the job ends its keys are revoked."""
    if not job.is_active or not (job.config or {}).get("gateway", {}).get("enabled"):
        return None
    event = (JobEvent.objects.filter(job=job, type="log", data__has_key="gateway").order_by("-seq")
             .values_list("data", flat=True).first())
    endpoint = event.get("gateway") if isinstance(event, dict) else None
    if not isinstance(endpoint, dict):
        return None
    return {"url": str(endpoint.get("url", "")), "job_key": str(endpoint.get("job_key", ""))}


@login_required
def job_detail(request: HttpRequest, pk: int) -> HttpResponse:
    job = get_object_or_404(visible_jobs(request), pk=pk)
    logs = JobEvent.objects.filter(job=job, type__in=["log", "status"]).order_by("-seq")[:200]
    checkpoints = list(job.checkpoints.all())
    # Resume is offered where it would work: the job ended failed or cancelled with a checkpoint, is not a warm
    # start, and the user is of its team (``actions.do_resume_job``'s rules).
    context = {"job": job, "logs": list(reversed(logs)), "checkpoints": checkpoints,
               "can_resume": job.can_resume and job.team.has_member(request.user),
               "tool_versions": job.tool_versions.select_related("entry"), "gateway": gateway_endpoint(job),
               "reward_errors": job.reward_errors()}
    if request.headers.get("HX-Request"):
        return render(request, "jobs/_job_live.html", context)
    return render(request, "jobs/job_detail.html", context | files.output_context(job) | files.checkpoints_context(job, request.user))


@login_required
@require_POST
def cancel(request: HttpRequest, pk: int) -> HttpResponse:
    job = get_object_or_404(TrainingJob.objects.visible_to(request.user), pk=pk)
    job = actions.do_cancel_job(job)
    messages.info(request, "Cancelled." if job.status == "cancelled" else
                  "Cancel requested; the job stops after its current step." if job.is_active else
                  f"The job had already {job.status}.")
    return redirect(job)


@login_required
@require_POST
@throttle("launch")
def resume(request: HttpRequest, pk: int) -> HttpResponse:
    job = get_object_or_404(TrainingJob.objects.visible_to(request.user), pk=pk)
    try:
        new_job, _ = actions.do_resume_job(user=request.user, job=job)
    except (actions.NotResumable, actions.QuotaExceeded) as exc:
        messages.error(request, str(exc))
        return redirect(job)
    messages.success(request, f"Job #{new_job.pk} continues from step {new_job.resumed_from.step}.")  # type: ignore[union-attr]
    return redirect(new_job)
