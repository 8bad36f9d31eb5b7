"""The landing page: what AgentFly is, and the calculator demo job one click away."""

from __future__ import annotations

import uuid
from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponsePermanentRedirect
from django.shortcuts import render
from django.templatetags.static import static

from webapp.accounts.models import Team
from webapp.demo import DEMO_JOB, DEMO_STEPS, SHIPPED_WARM_START, TINY_JOB, valid_model_dir
from webapp.jobs.forms import LaunchForm


def demo_job_fields(user: Any) -> list[tuple[str, Any]] | None:
    """The values the demo button posts to the normal launch action, or None when the registry lacks the
    calculator or ``math_equal`` (no worker has started yet)."""
    form = LaunchForm(user=user)
    tools, reward = form.fields["tools"].initial, form.fields["reward"].initial
    if not tools or reward is None:
        return None
    warm = valid_model_dir(SHIPPED_WARM_START)
    recipe = DEMO_JOB if warm else TINY_JOB
    fields = {**recipe, "name": "demo: calculator agent learning with GRPO", "model_source": "path" if warm else "tiny",
              "model_path": str(SHIPPED_WARM_START) if warm else "", "task": "arithmetic", "reward": reward,
              "steps": DEMO_STEPS if warm else 30, "queue": "cpu", "launch_key": uuid.uuid4().hex}
    return [*fields.items(), *(("tools", pk) for pk in tools)]  # hidden inputs, one per value


def landing(request: HttpRequest) -> HttpResponse:
    context: dict[str, Any] = {}
    if request.user.is_authenticated:
        context["teams"] = list(Team.objects.of(request.user).select_related("group"))
        context["demo"] = demo_job_fields(request.user) if context["teams"] else None
        from webapp.jobs.models import ACTIVE, TrainingJob

        # A job already running (the demo's, a teammate's) is what the user came to watch: shown first.
        context["active_jobs"] = list(TrainingJob.objects.visible_to(request.user).filter(status__in=ACTIVE)[:5])
    return render(request, "landing.html", context)


def favicon(request: HttpRequest) -> HttpResponse:
    """Browsers ask for /favicon.ico whatever the page links: send them to the SVG instead of a 404."""
    return HttpResponsePermanentRedirect(static("favicon.svg"))
