"""Admin for teams, users and groups, and the mixin that confines non-superuser staff to their own teams.

A staff member who is not a superuser sees and changes only rows of the teams they belong to, and every
foreign-key and many-to-many choice offers only such rows (plus the built-in tools and rewards, which every
team may pick), as does every list page's filter by a related row (``ScopedRelatedFilter``: Django's own lists
every team's name). Users and invitations are narrower: a staff member changes a user only when they administer
every team of that user (``Team.admins``), and sees only the invitations of the teams they administer. ``TEAM_PATHS`` says how each model reaches its team; every ModelAdmin of the project mixes
in ``TeamScoped``, so one rule covers lists, change forms, choices, autocomplete and raw-id pop-ups alike.
Privileges (superuser, staff, permissions) are granted by superusers only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from axes.admin import AccessAttemptAdmin, AccessLogAdmin
from axes.models import AccessAttempt, AccessLog
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group
from django.core.exceptions import ImproperlyConfigured
from django.db.models import Q, QuerySet
from django.forms import ModelMultipleChoiceField
from django.http import HttpRequest
from rest_framework.authtoken.admin import TokenAdmin
from rest_framework.authtoken.models import TokenProxy

from webapp.accounts.models import Invitation, Team

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

# How a row of each model reaches the team that owns it (a lookup path ending at a Team).
TEAM_PATHS: dict[str, str] = {
    "accounts.team": "pk",
    "accounts.invitation": "team",
    "auth.group": "team",
    "auth.user": "groups__team",
    "jobs.trainingjob": "team",
    "jobs.checkpoint": "job__team",
    "jobs.apiquota": "team",
    "registry.entry": "team",
    "registry.version": "entry__team",
    "monitor.jobevent": "job__team",
}
# Rows without a team that any team may pick (not change): the built-in tools and rewards and their versions.
PICKABLE_WITHOUT_TEAM = {"registry.entry", "registry.version"}


def _team_filter(label: str, user: Any, *, choosing: bool) -> Q:
    path = TEAM_PATHS[label]
    q = Q(**{f"{path}__in": Team.objects.of(user)})
    if choosing and label in PICKABLE_WITHOUT_TEAM:
        q |= Q(**{f"{path}__isnull": True})
    return q


def _is_relation(model: Any, path: str) -> bool:
    from django.contrib.admin.utils import get_fields_from_path

    return bool(getattr(get_fields_from_path(model, path)[-1], "is_relation", False))


def scoped(qs: QuerySet[Any], user: Any, *, choosing: bool = False) -> QuerySet[Any]:
    """``qs`` narrowed to the rows of ``user``'s teams (all rows for a superuser).

    ``choosing`` is for a form's choices, where built-in registry rows are allowed too. A path through a
    many-valued relation (a user in two teams) would repeat rows, hence the ``pk__in`` subquery.
    """
    if user.is_superuser:
        return qs
    label = qs.model._meta.label_lower
    if label not in TEAM_PATHS:
        raise ImproperlyConfigured(f"{label} has an admin but no entry in TEAM_PATHS (webapp/accounts/admin.py); "
                                   "say how its rows reach their team")
    return qs.filter(pk__in=qs.model._default_manager.filter(_team_filter(label, user, choosing=choosing))
                     .values("pk"))


class ScopedRelatedFilter(admin.RelatedFieldListFilter):
    """A list page's filter by a related row (a team, a group, a job), offering only rows the staff member's
    teams own: Django's own lists every row of the related table, every team's name among them."""

    def field_choices(self, field: Any, request: HttpRequest, model_admin: Any) -> list[tuple[str, StrOrPromise]]:
        related = field.related_model._default_manager.all()
        if related.model._meta.label_lower in TEAM_PATHS:
            related = scoped(related, request.user, choosing=True)
        ordering = self.field_admin_ordering(field, request, model_admin)
        return list(field.get_choices(include_blank=False, ordering=ordering,
                                      limit_choices_to=Q(pk__in=related.values("pk"))))


class TeamScoped:
    """Mix into a ModelAdmin or an inline (before the Django class) to confine non-superusers to their teams."""

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return scoped(super().get_queryset(request), request.user)  # type: ignore[misc]

    def get_list_filter(self, request: HttpRequest) -> Any:
        # Every filter by a related row offers only in-scope rows; others (status, kind) are the rows' own.
        filters = []
        for entry in super().get_list_filter(request):  # type: ignore[misc]
            if isinstance(entry, str) and _is_relation(self.model, entry):  # type: ignore[attr-defined]
                entry = (entry, ScopedRelatedFilter)
            filters.append(entry)
        return filters

    def _narrow(self, field: Any, request: HttpRequest) -> Any:
        queryset = getattr(field, "queryset", None)
        if queryset is not None and queryset.model._meta.label_lower in TEAM_PATHS:
            field.queryset = scoped(queryset, request.user, choosing=True)
        return field

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        field = self._narrow(super().formfield_for_foreignkey(db_field, request, **kwargs), request)  # type: ignore[misc]
        own_path = TEAM_PATHS.get(self.model._meta.label_lower, "")  # type: ignore[attr-defined]
        if field is not None and db_field.name == own_path.split("__")[0] and not request.user.is_superuser:
            # An entry without a team is a built-in that every team sees: only a superuser may make one.
            field.required = True
        return field

    def formfield_for_manytomany(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        return self._narrow(super().formfield_for_manytomany(db_field, request, **kwargs), request)  # type: ignore[misc]

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        # A many-to-many field shows only in-scope choices, and saving it would drop the rest: a staff member
        # of team A editing a user who is also in team C would silently take them out of C. Keep what they
        # could not see.
        hidden: dict[str, list[Any]] = {}
        if change and not request.user.is_superuser:
            for name, field in form.fields.items():
                if isinstance(field, ModelMultipleChoiceField):
                    hidden[name] = list(getattr(form.instance, name).exclude(
                        pk__in=field.queryset.values("pk")))  # type: ignore[union-attr]  # set by the admin
        super().save_related(request, form, formsets, change)  # type: ignore[misc]
        for name, rows in hidden.items():
            getattr(form.instance, name).add(*rows)


class TeamScopedAdmin(TeamScoped, admin.ModelAdmin):  # type: ignore[type-arg]  # not subscriptable at runtime
    pass


class SuperuserOnly:
    """For admin pages whose rows belong to no team (login attempts name any user): superusers only."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_superuser)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_superuser)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_superuser)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_superuser)


@admin.register(Team)
class TeamAdmin(TeamScopedAdmin):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "group__name"]
    filter_horizontal = ["admins"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = tuple(super().get_readonly_fields(request, obj))
        # A staff member who is a plain member must not make themselves the team's admin (and so reach its
        # users' passwords); team admins name others on the team page.
        return fields if request.user.is_superuser else (*fields, "admins")


@admin.register(Invitation)
class InvitationAdmin(TeamScopedAdmin):
    list_display = ["team", "created_by", "state", "created_at", "expires_at", "used_by"]
    readonly_fields = ["digest", "created_by", "used_by", "used_at"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        qs = super().get_queryset(request)
        # Only a team's admins manage its invitations (revoke, extend), here as on the team page.
        return qs if request.user.is_superuser else qs.filter(team__in=Team.objects.administered_by(request.user))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # the link's secret exists only at creation: members create invitations on the team page


# Django's own User and Group admins, scoped the same way.
User = get_user_model()
admin.site.unregister(User)
admin.site.unregister(Group)
PRIVILEGES = ("is_superuser", "is_staff", "user_permissions")
# Membership changes only by consent (an accepted invitation): a staff member never edits a user's teams.
STAFF_READONLY = (*PRIVILEGES, "groups")


@admin.register(User)
class TeamUserAdmin(TeamScoped, UserAdmin):  # type: ignore[type-arg]
    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        qs = super().get_queryset(request)
        if request.user.is_superuser:
            return qs
        # A staff member administers a user only when they administer every team of that user: sharing one
        # team must not let team A's staff set the password of someone who is also in team C and sign in as
        # them there, nor a staff member who is a plain member of team A set the password of A's users.
        # Superusers are out of reach too.
        others = Team.objects.exclude(pk__in=Team.objects.administered_by(request.user).values("pk"))
        return qs.filter(is_superuser=False).exclude(groups__team__in=others)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = tuple(super().get_readonly_fields(request, obj))
        return fields if request.user.is_superuser else fields + STAFF_READONLY

    def has_add_permission(self, request: HttpRequest) -> bool:
        # A new account belongs to no team, so its creator could never see it again: members invite instead.
        return bool(request.user.is_superuser)


@admin.register(Group)
class TeamGroupAdmin(TeamScoped, GroupAdmin):  # type: ignore[misc]  # GroupAdmin narrows the signature
    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = tuple(super().get_readonly_fields(request, obj))
        return fields if request.user.is_superuser else (*fields, "permissions")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_superuser)  # teams (and their groups) are made on the Teams page


# django-axes' records of failed sign-ins (AXES_ENABLE_ADMIN is off so they can be registered here).
@admin.register(AccessAttempt)
class LoginAttemptAdmin(SuperuserOnly, AccessAttemptAdmin):
    pass


@admin.register(AccessLog)
class LoginLogAdmin(SuperuserOnly, AccessLogAdmin):
    pass


# DRF's token admin shows every user's API key: a staff member reading a teammate's could act as them.
admin.site.unregister(TokenProxy)


@admin.register(TokenProxy)
class ApiTokenAdmin(SuperuserOnly, TokenAdmin):
    pass
