from __future__ import annotations

from typing import cast

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods

from webapp.accounts.throttling import throttle
from webapp.registry import actions, worker
from webapp.registry.forms import RegisterForm, TryForm
from webapp.registry.models import Entry, Kind
from webapp.registry.rules import NotRegistrable
from webapp.registry.trying import NoAnswer, TooManyTries, charged_team, try_on_worker


@login_required
def entry_list(request: HttpRequest) -> HttpResponse:
    entries = Entry.objects.visible_to(request.user).select_related("team__group", "current_version")
    return render(request, "registry/entry_list.html", {
        "tools": [e for e in entries if e.kind == Kind.TOOL],
        "rewards": [e for e in entries if e.kind == Kind.REWARD],
    })


@login_required
@require_http_methods(["GET", "POST"])
def register(request: HttpRequest) -> HttpResponse:
    form = RegisterForm(request.POST or None, user=request.user, initial={"kind": request.GET.get("kind", "tool")})
    if request.method == "POST" and form.is_valid():
        entry = actions.do_register_entry(user=request.user, team=form.cleaned_data["team"],
                                          kind=form.cleaned_data["kind"], import_path=form.cleaned_data["import_path"])
        messages.info(request, "A worker is importing it; its schema appears here when it is done.")
        return redirect("registry:detail", pk=entry.pk)
    return render(request, "registry/register.html", {"form": form}, status=400 if form.errors else 200)


@login_required
def entry_detail(request: HttpRequest, pk: int) -> HttpResponse:
    entry = get_object_or_404(Entry.objects.visible_to(request.user).select_related("current_version"), pk=pk)
    if request.headers.get("HX-Request"):
        response = render(request, "registry/_entry_status.html", {"entry": entry})
        if entry.status != "pending":
            response["HX-Refresh"] = "true"  # the inspection finished: show the schema and the "try it" form
        return response
    return render(request, "registry/entry_detail.html",
                  {"entry": entry, "try_form": TryForm(), "versions": entry.versions.all()})


@login_required
@require_http_methods(["POST"])
def reinspect(request: HttpRequest, pk: int) -> HttpResponse:
    entry = get_object_or_404(Entry.objects.visible_to(request.user).filter(team__isnull=False), pk=pk)
    try:
        actions.do_register_entry(user=request.user, team=entry.team,  # type: ignore[arg-type]  # team__isnull=False
                                  kind=entry.kind, import_path=entry.import_path)
    except NotRegistrable as exc:  # stored before the rule, or the plugin folder changed since
        worker.record_failure(entry.pk, str(exc))
        messages.error(request, str(exc))
    return redirect("registry:detail", pk=entry.pk)


@login_required
@require_http_methods(["POST"])
@throttle("try")
def try_tool(request: HttpRequest, pk: int) -> HttpResponse:
    """Call the tool on a worker and show the observation (the web process never imports the tool)."""
    entry = get_object_or_404(Entry.objects.visible_to(request.user).ready().tools(), pk=pk)
    form = TryForm(request.POST)
    result = None
    status = 200
    if form.is_valid():
        try:
            result = try_on_worker(cast(int, request.user.pk), entry.pk,  # signed in (login_required)
                                   form.cleaned_data["arguments"],
                                   team_id=charged_team(entry, request.user))
        except TooManyTries as exc:
            result, status = {"observation": "", "latency": 0.0, "error": str(exc)}, 429
        except NoAnswer as exc:
            result = {"observation": "", "latency": 0.0, "error": str(exc)}
    else:
        status = 400
    template = "registry/_try_result.html" if request.headers.get("HX-Request") else "registry/entry_detail.html"
    return render(request, template, {"entry": entry, "try_form": form, "result": result,
                                      "versions": entry.versions.all()}, status=status)
