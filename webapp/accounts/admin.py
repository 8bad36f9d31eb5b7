"""Admin for teams, and the mixin that confines non-superuser staff to their own teams' rows."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from webapp.accounts.models import Team


class TeamScopedAdmin(admin.ModelAdmin):
    """Staff who are not superusers see and change only rows of their teams (``team_field`` names the path)."""

    team_field = "team"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        qs = super().get_queryset(request)
        if request.user.is_superuser:
            return qs
        return qs.filter(**{f"{self.team_field}__in": Team.objects.of(request.user)})

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.related_model is Team and not request.user.is_superuser:
            kwargs["queryset"] = Team.objects.of(request.user)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


@admin.register(Team)
class TeamAdmin(TeamScopedAdmin):
    team_field = "pk"
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "group__name"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        qs = admin.ModelAdmin.get_queryset(self, request)
        return qs if request.user.is_superuser else qs.filter(pk__in=Team.objects.of(request.user))
