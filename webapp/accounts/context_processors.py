from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from webapp.accounts.models import Team


def teams(request: HttpRequest) -> dict[str, Any]:
    """The signed-in user's teams, for the navigation bar."""
    return {"my_teams": Team.objects.of(request.user).select_related("group") if hasattr(request, "user") else []}
