"""The sweep pages: a team's sweeps, launching one, and a sweep's group page (its runs, the best by a chosen
metric, parallel coordinates and each run's curve). Views parse, call one action, render; a team sees only its
own sweeps (another team's is a 404)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods

from webapp.accounts.throttling import throttle
from webapp.jobs.actions import QuotaExceeded
from webapp.monitor.groups import metric_curve, run_curve
from webapp.sweeps import actions
from webapp.sweeps.forms import SweepForm
from webapp.sweeps.models import Goal, Sweep


def visible_sweeps(request: HttpRequest) -> Any:
    return Sweep.objects.visible_to(request.user).select_related("team")


@login_required
def sweep_list(request: HttpRequest) -> HttpResponse:
    return render(request, "sweeps/sweep_list.html", {"sweeps": visible_sweeps(request).prefetch_related("runs")})


@login_required
@require_http_methods(["GET", "POST"])
@throttle("launch")
def launch(request: HttpRequest) -> HttpResponse:
    initial = {"base_job": request.GET.get("base", "")} if request.GET.get("base", "").isdecimal() else {}
    form = SweepForm(request.POST or None, user=request.user, initial=initial)
    if request.method == "POST" and form.is_valid():
        d = form.cleaned_data
        try:
            sweep = actions.do_launch_sweep(user=request.user, base=d["base_job"], name=d["name"], kind=d["kind"],
                                            space=d["space"], count=d["count"] or 0, seed=d["seed"] or 0,
                                            metric=d["metric"], goal=d["goal"])
        except (actions.SweepRefused, QuotaExceeded) as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"{sweep.runs.count()} runs are queued as sweep {sweep.name!r}.")
            return redirect(sweep)
    return render(request, "sweeps/launch.html", {"form": form}, status=400 if form.errors else 200)


def chosen_metric(request: HttpRequest, sweep: Sweep) -> tuple[str, str]:
    metric = (request.GET.get("metric") or sweep.metric)[:100]
    asked = request.GET.get("goal")
    goal = asked if asked in Goal.values else sweep.goal
    return metric, goal


@login_required
def sweep_detail(request: HttpRequest, pk: int) -> HttpResponse:
    sweep = get_object_or_404(visible_sweeps(request), pk=pk)
    metric, goal = chosen_metric(request, sweep)
    runs = list(sweep.runs.select_related("job"))
    values = {r.job_id: actions.run_value(r.job, metric) for r in runs}
    best = actions.best_run(values, goal)
    return render(request, "sweeps/sweep_detail.html", {
        "sweep": sweep, "metric": metric, "goal": goal, "best": best, "fields": sweep.fields,
        "rows": [(r, [r.params.get(f) for f in sweep.fields], values[r.job_id]) for r in runs],
        "goals": Goal.choices, "compare_ids": ",".join(str(r.job_id) for r in runs)})


@login_required
def sweep_data(request: HttpRequest, pk: int) -> JsonResponse:
    """The group page's charts: each run's swept values, its value of the metric and its curve, and the best."""
    sweep = get_object_or_404(visible_sweeps(request), pk=pk)
    metric, goal = chosen_metric(request, sweep)
    runs = list(sweep.runs.select_related("job"))
    values = {r.job_id: actions.run_value(r.job, metric) for r in runs}
    return JsonResponse({"metric": metric, "goal": goal, "fields": sweep.fields,
                         "best": actions.best_run(values, goal), "runs": [
                             {"job": r.job_id, "label": ", ".join(f"{k}={v}" for k, v in r.params.items()),
                              "params": r.params, "value": values[r.job_id], "status": r.job.status,
                              "curve": run_curve(*metric_curve(r.job, metric))} for r in runs]})
