"""Dashboard pages and the JSON history endpoint: a job's pages over the events ``webapp.monitor`` stores and
reads (the jobs app depends on the monitor app, never the reverse).

The pages render a shell; the numbers come from the job's stored events only, over the websocket (history
then live, see ``consumers``) or, for scripts and the compare page's first load, from ``events.json``.
Every view filters jobs through ``TrainingJob.objects.visible_to(user)``: a job of another team is a 404,
the same answer as a job that does not exist.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from webapp.inputs import PG_BIGINT_MAX, query_int
from webapp.jobs.models import CANCELLABLE, PHASE_LABELS, Kind, TrainingJob
from webapp.monitor.events import events_after, requested_types
from webapp.monitor.models import EventType, JobEvent, JobNote
from webapp.monitor.runs import config_diff, hyperparameter_rows, seed_groups
from webapp.monitor.series import DEFAULT_POINTS, MAX_POINTS, Ancestor, job_series
from webapp.monitor.tokens import job_model_path, with_token_texts

MAX_EVENTS_PER_REQUEST = 5000
MAX_COMPARED_JOBS = 8
MAX_RESUME_CHAIN = 20  # a job resumed from a resumed job ...: how far back its charts go


def _job_context(job: TrainingJob) -> dict[str, Any]:
    """What the page's script needs to know about one job (ids and URLs, no numbers)."""
    return {
        "id": job.pk,
        "name": job.name,
        "status": job.status,
        "step": job.step,
        "total_steps": job.total_steps,
        "ws_path": f"/ws/jobs/{job.pk}/",
        "events_url": reverse("monitor:events", args=[job.pk]),
        "series_url": reverse("monitor:series", args=[job.pk]),
        "event_url": reverse("monitor:event", args=[job.pk, 0]).removesuffix("0.json"),
        "cancel_url": reverse("jobs:cancel", args=[job.pk]),
        "detail_url": job.get_absolute_url(),
        "dashboard_url": reverse("monitor:dashboard", args=[job.pk]),
        "search_url": reverse("monitor:samples_search", args=[job.pk]),
    }


@login_required
def dashboard(request: HttpRequest, pk: int) -> HttpResponse:
    job = get_object_or_404(TrainingJob.objects.visible_to(request.user).select_related("team__group"), pk=pk)
    # Resume queues work for the job's team: offered to its members only, and only where there is a checkpoint.
    member = job.team.has_member(request.user)
    can_resume = job.can_resume and member
    # A live job that may yet fail or be cancelled gets the form hidden; the page shows it when the job ends so
    # with a checkpoint, without a reload.
    offer_resume = can_resume or (member and job.is_active and job.kind != Kind.SFT)
    # The words of each state and of Cancel's question, from the model: the script shows the job's state live.
    texts = {"phase_labels": PHASE_LABELS,
             "cancel_questions": {phase: job.cancel_question_in(phase) for phase in CANCELLABLE}}
    offer_resume = offer_resume and job.phase != "resumed"
    return render(request, "monitor/dashboard.html", {
        "job": job, "monitor_config": {**_job_context(job), **texts, "user": request.user.get_username()},
        "can_resume": can_resume and job.phase != "resumed", "offer_resume": offer_resume,
        "reward_errors": job.reward_errors()})


def parse_job_ids(values: list[str]) -> list[int]:
    """Job ids from ``?jobs=3,4&jobs=7``; raises ``ValueError`` naming the bad value."""
    ids: list[int] = []
    for value in values:
        for part in value.split(","):
            part = part.strip().lstrip("#")
            if not part:
                continue
            # isdecimal, not isdigit ("²" is a digit int() refuses); a bigint bound keeps SQL from overflowing.
            if not part.isdecimal() or len(part) > 18:
                raise ValueError(f"{part!r} is not a job id; pick jobs from the list or pass ?jobs=3,4")
            if int(part) not in ids:
                ids.append(int(part))
    if len(ids) > MAX_COMPARED_JOBS:
        raise ValueError(f"{len(ids)} jobs selected; compare at most {MAX_COMPARED_JOBS} at a time")
    return ids


@login_required
def compare(request: HttpRequest) -> HttpResponse:
    visible = TrainingJob.objects.visible_to(request.user).select_related("team__group")
    try:
        ids = parse_job_ids(request.GET.getlist("jobs"))
    except ValueError as exc:
        messages.error(request, str(exc))
        ids = []
    chosen = {job.pk: job for job in visible.filter(pk__in=ids)}
    missing = [i for i in ids if i not in chosen]
    if missing:
        messages.error(request, "Not among your teams' jobs: " + ", ".join(f"#{i}" for i in missing))
    jobs = [chosen[i] for i in ids if i in chosen]
    columns, metrics, rows = hyperparameter_rows(jobs)
    return render(request, "monitor/compare.html", {
        "diff": config_diff([j.launch_config for j in jobs]) if len(jobs) > 1 else [],
        "hp_columns": columns, "hp_metrics": metrics, "hp_rows": rows, "seed_groups": seed_groups(jobs),
        "jobs": jobs,
        "candidates": visible[:100],
        "selected": {job.pk for job in jobs},
        "monitor_config": {"jobs": [_job_context(job) for job in jobs], "user": request.user.get_username()},
    })


def _bad_request(message: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=400)


@login_required
def events_json(request: HttpRequest, pk: int) -> JsonResponse:
    """``GET .../events.json?after=<seq>&types=metrics,status&limit=<n>``: stored events with ``seq > after``.

    ``more`` says whether another page follows (ask again with ``after=last_seq``).
    """
    job = get_object_or_404(TrainingJob.objects.visible_to(request.user), pk=pk)
    after_raw = request.GET.get("after", "0") or "0"
    try:
        after = query_int(request.GET, "after", 0, 0, PG_BIGINT_MAX)
    except ValueError:
        return _bad_request(f"after={after_raw[:40]!r} is not a sequence number; pass the last seq you have "
                            "(0 for all)")
    limit_raw = request.GET.get("limit", "1000") or "1000"
    try:
        limit = query_int(request.GET, "limit", 1000, 1, MAX_EVENTS_PER_REQUEST)
    except ValueError:
        return _bad_request(f"limit={limit_raw[:40]!r} must be an integer from 1 to {MAX_EVENTS_PER_REQUEST}")
    types = requested_types(request.GET)
    unknown = sorted(set(types) - set(EventType.values))
    if unknown:
        return _bad_request(f"unknown event types {unknown}; use some of {sorted(EventType.values)}")
    model = job_model_path(job.config)
    events = [with_token_texts(m, model) for m in events_after(job.pk, after, types or None, limit=limit + 1)]
    more = len(events) > limit
    events = events[:limit]
    return JsonResponse({
        "job": {**job.summary(), "name": job.name},
        "events": events,
        "last_seq": events[-1]["seq"] if events else after,
        "more": more,
    })


def _step_param(request: HttpRequest, name: str) -> int | None:
    if not request.GET.get(name):
        return None
    return query_int(request.GET, name, 0, -(2**31), 2**31 - 1)


def resumed_lineage(job: TrainingJob, visible: Any) -> list[tuple[TrainingJob, int]]:
    """``(ancestor, resume step)`` pairs, oldest first: the job it was resumed from (at that checkpoint's
    step), the one that one was resumed from, and so on. Only jobs of the job's own team, among ``visible``
    (the user's), are followed: a checkpoint path copied from elsewhere never shows another team's history."""
    from webapp.jobs.models import Checkpoint

    chain: list[tuple[TrainingJob, int]] = []
    seen = {job.pk}
    current = job
    while current.resumed_from_id is not None and len(chain) < MAX_RESUME_CHAIN:
        checkpoint = Checkpoint.objects.filter(pk=current.resumed_from_id).values("job_id", "step").first()
        if checkpoint is None or checkpoint["job_id"] in seen:
            break
        parent = visible.filter(pk=checkpoint["job_id"], team_id=job.team_id).first()
        if parent is None:
            break
        chain.append((parent, int(checkpoint["step"])))
        seen.add(parent.pk)
        current = parent
    return chain[::-1]


@login_required
def series_json(request: HttpRequest, pk: int) -> JsonResponse:
    """``GET .../series.json?from=<step>&to=<step>&points=<n>&keys=a,b``: the job's history, downsampled.

    Without ``from``/``to``: every metric and resource column (min/max per bucket down to ``points``), the
    sample steps, the newest resources event and the log tail, all as of ``last_seq`` (connect the socket with
    ``?after=last_seq``). With a range (a zoom): only the metric columns in it (``keys`` to name some).
    A resumed job's metric columns begin with its ancestors' points (``lineage``: each ancestor and the step
    its history is shown up to).
    """
    visible = TrainingJob.objects.visible_to(request.user)
    job = get_object_or_404(visible, pk=pk)
    try:
        first, last = _step_param(request, "from"), _step_param(request, "to")
    except ValueError:
        return _bad_request("from= and to= must be step numbers (integers)")
    try:
        points = query_int(request.GET, "points", DEFAULT_POINTS, 2, MAX_POINTS)
    except ValueError:
        return _bad_request(f"points must be an integer from 2 to {MAX_POINTS}")
    keys = [k for value in request.GET.getlist("keys") for k in value.split(",") if k] or None
    # A zoom (a range or named keys) and the compare page (only=metrics) need the metric columns alone.
    zoom = first is not None or last is not None or keys is not None or request.GET.get("only") == "metrics"
    lineage = resumed_lineage(job, visible)
    series = job_series(job.pk, job.last_seq, first_step=first, last_step=last, points=points, keys=keys,
                        full=not zoom, ancestors=[Ancestor(a.pk, a.last_seq, step) for a, step in lineage])
    return JsonResponse({"job": {**job.summary(), "name": job.name},
                         "lineage": [{"id": a.pk, "name": a.name, "to_step": step} for a, step in lineage], **series})


@login_required
def event_json(request: HttpRequest, pk: int, seq: int) -> JsonResponse:
    """``GET .../events/<seq>.json``: one stored event in full (a sample step's trajectories, with the token
    texts decoded for the token view), the one a page shows of those the socket sent as stubs."""
    job = get_object_or_404(TrainingJob.objects.visible_to(request.user), pk=pk)
    event = get_object_or_404(JobEvent, job_id=job.pk, seq=seq)
    return JsonResponse(with_token_texts(event.as_message(), job_model_path(job.config)))


MAX_SEARCH_EVENTS = 200


@login_required
def samples_search(request: HttpRequest, pk: int) -> JsonResponse:
    """``GET .../samples/search.json?q=text``: the job's sample steps whose stored trajectories contain ``q``
    (case-insensitive, in any field: text, messages, tool calls, answer), newest first, with how many of each
    step's trajectories match: ``{"q", "matches": [{"step", "seq", "count"}], "more"}``."""
    import orjson
    from django.db.models import TextField
    from django.db.models.functions import Cast

    job = get_object_or_404(TrainingJob.objects.visible_to(request.user), pk=pk)
    q = request.GET.get("q", "").strip()
    if not 2 <= len(q) <= 200:
        return _bad_request("q must be 2 to 200 characters of text to look for in the trajectories")
    rows = list(JobEvent.objects.filter(job_id=job.pk, type=EventType.SAMPLES)
                .annotate(text=Cast("data", TextField())).filter(text__icontains=q)
                .order_by("-seq").values_list("seq", "step", "text")[:MAX_SEARCH_EVENTS + 1])
    needle = q.lower()
    matches = []
    for seq, step, text in rows[:MAX_SEARCH_EVENTS]:
        trajectories = (orjson.loads(text) or {}).get("trajectories") or []
        count = sum(1 for t in trajectories if needle in orjson.dumps(t).decode().lower())
        if count:
            matches.append({"step": step, "seq": seq, "count": count})
    return JsonResponse({"q": q, "matches": matches, "more": len(rows) > MAX_SEARCH_EVENTS})


def parse_tags(text: str) -> list[str]:
    """Tags from ``"lr sweep, baseline"``: trimmed, lower-case, each once; raises ``ValueError`` naming the rule."""
    tags: list[str] = []
    for raw in text.split(","):
        tag = " ".join(raw.split()).lower()
        if not tag or tag in tags:
            continue
        if len(tag) > JobNote.MAX_TAG_LENGTH:
            raise ValueError(f"the tag {tag[:40]!r} is longer than {JobNote.MAX_TAG_LENGTH} characters; shorten it")
        tags.append(tag)
    if len(tags) > JobNote.MAX_TAGS:
        raise ValueError(f"{len(tags)} tags; a job takes at most {JobNote.MAX_TAGS}")
    return tags


@login_required
@require_POST
def job_note(request: HttpRequest, pk: int) -> HttpResponse:
    """``POST .../notes/`` (tags: comma-separated; notes: text): the team's tags and notes on its job."""
    job = get_object_or_404(TrainingJob.objects.visible_to(request.user), pk=pk)
    notes = request.POST.get("notes", "")
    try:
        tags = parse_tags(request.POST.get("tags", "")[:2000])
        if len(notes) > 5000:
            raise ValueError(f"the notes are {len(notes)} characters; keep them under 5000")
    except ValueError as exc:
        messages.error(request, f"Tags and notes not saved: {exc}.")
        return redirect(job)
    JobNote.objects.update_or_create(job=job, defaults={"tags": tags, "notes": notes})
    messages.success(request, "Tags and notes saved.")
    return redirect(job)
