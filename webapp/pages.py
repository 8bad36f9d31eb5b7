"""The landing page: what AgentFly is, and the demo job (the key chain, as ``python -m webapp.demo`` runs it)
one click away."""

from __future__ import annotations

import uuid
from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponsePermanentRedirect
from django.shortcuts import render
from django.templatetags.static import static

from webapp.accounts.models import Team
from webapp.demo import KEY_CHAIN_STEPS, KEY_CHAIN_WARM_START, demo_fields, valid_model_dir


def demo_job_fields(user: Any) -> list[tuple[str, Any]] | None:
    """The values the demo button posts to the normal launch action: the key-chain job ``python -m webapp.demo``
    launches, from its shipped warm start (the untrained tiny model when that is missing); None while the
    registry lacks ``lookup`` or ``chain_answer`` (no worker has started yet)."""
    model = KEY_CHAIN_WARM_START if valid_model_dir(KEY_CHAIN_WARM_START) else None
    found = demo_fields(user, "key_chain", model)
    if found is None:
        return None
    fields, tools, reward = found
    fields |= {"reward": reward.pk, "steps": KEY_CHAIN_STEPS if model else 30, "queue": "cpu",
               "launch_key": uuid.uuid4().hex}
    return [*fields.items(), *(("tools", t.pk) for t in tools)]  # hidden inputs, one per value


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
