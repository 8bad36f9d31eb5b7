"""The MCP server pages: a team's servers, registering one, its inspection, versions and tool schemas, "try
it", and the jobs that use it. Each view parses, calls one action of ``webapp.mcpservers.actions`` (the same
the REST API calls), and renders; a team sees only its own servers (another team's is a 404)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from webapp.accounts.models import Team
from webapp.accounts.throttling import throttle
from webapp.mcpservers import actions
from webapp.mcpservers.forms import RegisterServerForm, TryServerForm
from webapp.mcpservers.models import MCPServer, Status, Transport
from webapp.mcpservers.rules import NotAllowed
from webapp.registry.tryslots import TooManyTries


def visible_servers(request: HttpRequest) -> Any:
    return MCPServer.objects.visible_to(request.user).select_related("team", "current_version")


def jobs_using(server: MCPServer) -> Any:
    """The jobs of the server's team whose config names it (``mcp.<name>``), newest first."""
    from webapp.jobs.models import TrainingJob

    return (TrainingJob.objects.filter(team=server.team, config__mcp__has_key=server.name)
            .only("pk", "name", "status", "created_at").order_by("-pk")[:50])


@login_required
def server_list(request: HttpRequest) -> HttpResponse:
    teams = list(Team.objects.of(request.user).select_related("group").order_by("slug"))
    chosen = request.GET.get("team", "")
    if chosen:
        teams = [t for t in teams if t.slug == chosen]
    servers = list(visible_servers(request).filter(team__in=teams))
    return render(request, "mcpservers/server_list.html", {
        "teams": [(t, [s for s in servers if s.team_id == t.pk]) for t in teams], "chosen": chosen})


@login_required
@require_http_methods(["GET", "POST"])
@throttle("launch")
def register(request: HttpRequest) -> HttpResponse:
    form = RegisterServerForm(request.POST or None, user=request.user,
                              initial={"team": Team.objects.of(request.user).filter(slug=request.GET.get("team", ""))
                                       .first()})
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            server = actions.do_register_server(
                user=request.user, team=data["team"], name=data["name"], transport=data["transport"],
                command=data["command"], url=data["url"], reset_tool=data["reset_tool"], seed_tool=data["seed_tool"])
        except NotAllowed as exc:
            form.add_error("command" if data["transport"] == Transport.STDIO else "url", str(exc))
        except actions.TooManyInspections as exc:  # the inspection places are bounded (per team and in all)
            form.add_error(None, str(exc))
            return render(request, "mcpservers/register.html", {"form": form}, status=429)
        else:
            messages.info(request, "A worker is starting the server to list its tools; they appear here when it "
                                   "is done.")
            return redirect("mcpservers:detail", pk=server.pk)
    return render(request, "mcpservers/register.html", {"form": form}, status=400 if form.errors else 200)


def detail_context(server: MCPServer, try_form: TryServerForm | None = None,
                   result: dict[str, Any] | None = None) -> dict[str, Any]:
    tools = server.current_version.tools if server.current_version else []
    return {"server": server, "tools": tools, "versions": server.versions.all(), "jobs": jobs_using(server),
            "try_form": try_form or TryServerForm(tools=tools), "result": result}


@login_required
def server_detail(request: HttpRequest, pk: int) -> HttpResponse:
    server = get_object_or_404(visible_servers(request), pk=pk)
    if request.headers.get("HX-Request"):  # the inspection's progress, polled while it runs
        response = render(request, "mcpservers/_server_status.html", {"server": server})
        if server.status != Status.PENDING:
            response["HX-Refresh"] = "true"  # it finished: show the tools and the "try it" form
        return response
    return render(request, "mcpservers/server_detail.html", detail_context(server))


@login_required
@require_POST
@throttle("launch")
def reinspect(request: HttpRequest, pk: int) -> HttpResponse:
    server = get_object_or_404(visible_servers(request), pk=pk)
    try:
        actions.do_register_server(user=request.user, team=server.team, name=server.name,
                                   transport=server.transport, command=list(server.command), url=server.url,
                                   reset_tool=server.reset_tool, seed_tool=server.seed_tool)
    except NotAllowed as exc:  # the rule or the plugin folder changed since it was registered
        messages.error(request, str(exc))
    return redirect("mcpservers:detail", pk=server.pk)


@login_required
@require_POST
@throttle("try")
def try_tool(request: HttpRequest, pk: int) -> HttpResponse:
    """Call one tool of a ready server on a worker and show what the model would read."""
    server = get_object_or_404(visible_servers(request).filter(status=Status.READY, current_version__isnull=False),
                               pk=pk)
    form = TryServerForm(request.POST, tools=server.current_version.tools)
    result, status = None, 200
    if form.is_valid():
        try:
            result = actions.do_try_tool(user=request.user, server=server, tool=form.cleaned_data["tool"],
                                         arguments=form.cleaned_data["arguments"])
        except TooManyTries as exc:
            result, status = {"observation": "", "latency": 0.0, "error": str(exc)}, 429
        except actions.NoAnswer as exc:
            result = {"observation": "", "latency": 0.0,
                      "error": f"{exc}: is a worker running on the try queue (celery -A webapp worker -Q try)?"}
    else:
        status = 400
    if request.headers.get("HX-Request"):
        return render(request, "registry/_try_result.html", {"try_form": form, "result": result}, status=status)
    return render(request, "mcpservers/server_detail.html", detail_context(server, form, result), status=status)
