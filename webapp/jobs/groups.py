"""Runs in groups on the compare page: each group of runs that differ only by seed, drawn as one metric's mean
curve with a band (std or min-max). A view parses, reads the curves (``webapp.monitor.groups``), answers."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, JsonResponse

from webapp.jobs.dashboard import parse_job_ids
from webapp.jobs.models import TrainingJob
from webapp.monitor.groups import BANDS, band, metric_curve, metric_names
from webapp.monitor.runs import seed_groups

DEFAULT_METRIC = "reward/mean"


@login_required
def seed_bands_json(request: HttpRequest) -> JsonResponse:
    """``GET /monitor/compare/seed-bands.json?jobs=3,4,5&metric=reward/mean&band=std``: for each group of the
    jobs that differ only by seed, the metric's mean and band per step; ``metrics`` names what can be drawn."""
    try:
        ids = parse_job_ids(request.GET.getlist("jobs"))
    except ValueError as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    kind = request.GET.get("band", "std")
    if kind not in BANDS:
        return JsonResponse({"error": f"band must be one of {', '.join(BANDS)}"}, status=400)
    chosen = {j.pk: j for j in TrainingJob.objects.visible_to(request.user).filter(pk__in=ids)}
    jobs = [chosen[i] for i in ids if i in chosen]
    groups = seed_groups(jobs)
    members = [j for g in groups for j in g["jobs"]]
    names = metric_names(members)
    metric = request.GET.get("metric") or (DEFAULT_METRIC if DEFAULT_METRIC in names else (names or [""])[0])
    return JsonResponse({"metric": metric, "band": kind, "metrics": names, "groups": [
        {"label": "seeds " + ", ".join(str(s) for s in g["seeds"]) + " (" + ", ".join(f"#{j.pk}" for j in g["jobs"]) + ")",
         "jobs": [j.pk for j in g["jobs"]], **band([metric_curve(j, metric) for j in g["jobs"]], kind)}
        for g in groups]})
