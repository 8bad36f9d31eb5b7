from typing import Any

from django.contrib import admin

from webapp.accounts.admin import SuperuserOnly, TeamScoped, TeamScopedAdmin
from webapp.jobs.models import APIQuota, Checkpoint, TeamQuota, TrainingJob


class CheckpointInline(TeamScoped, admin.TabularInline):  # type: ignore[type-arg]  # not subscriptable at runtime
    model = Checkpoint
    extra = 0
    readonly_fields = ["step", "path", "metrics", "created_at"]


@admin.register(TrainingJob)
class TrainingJobAdmin(TeamScopedAdmin):
    list_display = ["id", "name", "team", "kind", "status", "queue", "step", "total_steps", "created_at"]
    list_filter = ["status", "kind", "queue"]
    search_fields = ["name"]
    readonly_fields = ["celery_task_id", "worker", "heartbeat_at", "last_seq", "started_at", "finished_at"]
    inlines = [CheckpointInline]


@admin.register(Checkpoint)
class CheckpointAdmin(TeamScopedAdmin):
    list_display = ["job", "step", "path", "created_at"]


@admin.register(TeamQuota)
class TeamQuotaAdmin(SuperuserOnly, admin.ModelAdmin):  # type: ignore[type-arg]
    """Quotas are the operator's: only superusers see or change them (a team's staff cannot raise its own)."""

    list_display = ["team", "concurrent_jobs", "max_steps", "max_seconds"]

    def has_add_permission(self, request: Any) -> bool:
        return bool(request.user.is_superuser)


@admin.register(APIQuota)
class APIQuotaAdmin(TeamScopedAdmin):
    """A team's limits on a rate-limited API. Superusers add and change them; a staff member sees their own
    teams' (scoped like every admin page) but changes none: the limits share out a provider that other teams
    may use too, so a team's staff must not raise their own."""

    list_display = ["team", "api", "rate", "burst", "concurrency", "daily_quota", "updated_at"]
    list_filter = ["team"]
    search_fields = ["api", "team__slug"]

    def has_module_permission(self, request: Any) -> bool:
        return bool(request.user.is_active and request.user.is_staff)

    def has_view_permission(self, request: Any, obj: Any = None) -> bool:
        return bool(request.user.is_active and request.user.is_staff)  # the rows: get_queryset scopes them

    def has_add_permission(self, request: Any) -> bool:
        return bool(request.user.is_superuser)

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return bool(request.user.is_superuser)

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return bool(request.user.is_superuser)
