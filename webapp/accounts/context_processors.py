from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest

from webapp.accounts.models import Team


def teams(request: HttpRequest) -> dict[str, Any]:
    """The signed-in user's teams and who may sign up, for the navigation bar."""
    return {"my_teams": Team.objects.of(request.user).select_related("group") if hasattr(request, "user") else [],
            "signup_mode": settings.AGENTFLY_SIGNUP}
