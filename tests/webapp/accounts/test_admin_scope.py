"""The admin is scoped: a staff member who is not a superuser sees, changes and picks only their teams' rows."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.forms import ModelChoiceField
from django.test import Client
from django.urls import reverse

from tests.webapp.factories import ready_entry
from webapp.accounts.admin import TEAM_PATHS, SuperuserOnly
from webapp.accounts.models import Invitation, Team, do_create_invitation
from webapp.jobs.models import APIQuota, Checkpoint, TrainingJob
from webapp.monitor.models import JobEvent
from webapp.registry.models import Entry, Kind

APPS = ["accounts", "auth", "jobs", "registry", "monitor", "axes", "authtoken"]


def rows_of(team: Team, user: Any) -> dict[str, Any]:
    """One row of every team-owned model for ``team``."""
    job = TrainingJob.objects.create(team=team, name=f"{team.slug} job", config={}, created_by=user)
    entry = ready_entry(team, Kind.TOOL, f"tools_{team.pk}:echo", f"echo {team.slug}")
    return {"job": job, "checkpoint": Checkpoint.objects.create(job=job, step=1, path=f"/runs/{team.slug}/1"),
            "entry": entry, "version": entry.current_version,
            "event": JobEvent.objects.create(job=job, seq=1, type="log", time=0.0, data={}),
            "invitation": do_create_invitation(team, user)[0],
            "api_quota": APIQuota.objects.create(team=team, api="search", rate=5)}


@pytest.fixture
def world(alice: Any, team_a: Team, bob: Any, team_b: Team) -> dict[str, Any]:
    """alice is staff (every permission on the project's models, not a superuser) in team A; bob is in B."""
    alice.is_staff = True
    alice.save()
    alice.user_permissions.set(Permission.objects.filter(content_type__app_label__in=APPS))
    return {"a": rows_of(team_a, alice), "b": rows_of(team_b, bob)}


@pytest.fixture
def staff_client(world: dict[str, Any], alice: Any) -> Client:
    client = Client()
    client.force_login(get_user_model().objects.get(pk=alice.pk))  # fresh permission cache
    return client


def team_scoped_admins() -> list[Any]:
    return [ma for model, ma in admin.site._registry.items() if model._meta.label_lower in TEAM_PATHS]


def url(model: Any, view: str, *args: Any) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


def test_a_staff_member_sees_only_their_teams_jobs_in_the_admin(staff_client: Client,
                                                                world: dict[str, Any]) -> None:
    page = staff_client.get(url(TrainingJob, "changelist"))
    assert page.status_code == 200
    assert list(page.context["cl"].queryset) == [world["a"]["job"]]
    assert "team-b job" not in page.content.decode()
    other = staff_client.get(url(TrainingJob, "change", world["b"]["job"].pk))
    assert other.status_code == 302 and other["Location"] == reverse("admin:index")
    assert staff_client.post(url(TrainingJob, "delete", world["b"]["job"].pk), {"post": "yes"}).status_code == 302
    assert TrainingJob.objects.filter(pk=world["b"]["job"].pk).exists()


def test_the_checkpoint_add_form_refuses_another_teams_job(staff_client: Client, world: dict[str, Any]) -> None:
    form = staff_client.get(url(Checkpoint, "add")).context["adminform"].form
    assert list(form.fields["job"].queryset) == [world["a"]["job"]]
    response = staff_client.post(url(Checkpoint, "add"), {"job": world["b"]["job"].pk, "step": 7, "path": "/x",
                                                         "metrics": "{}"})
    assert response.status_code == 200
    assert "Select a valid choice" in " ".join(response.context["adminform"].form.errors["job"])
    assert not Checkpoint.objects.filter(step=7).exists()
    ok = staff_client.post(url(Checkpoint, "add"), {"job": world["a"]["job"].pk, "step": 7, "path": "/x",
                                                   "metrics": "{}"})
    assert ok.status_code == 302 and Checkpoint.objects.get(step=7).job == world["a"]["job"]


def test_every_admin_page_is_scoped_to_teams_or_to_superusers() -> None:
    unscoped = [type(ma).__name__ for model, ma in admin.site._registry.items()
                if model._meta.label_lower not in TEAM_PATHS and not isinstance(ma, SuperuserOnly)]
    assert unscoped == []
    assert {ma.model._meta.label_lower for ma in team_scoped_admins()} == set(TEAM_PATHS)


@pytest.mark.parametrize("label", sorted(TEAM_PATHS))
def test_every_admin_list_shows_only_the_staff_members_teams(label: str, staff_client: Client, team_a: Team,
                                                             team_b: Team) -> None:
    model = admin.site._registry[next(m for m in admin.site._registry if m._meta.label_lower == label)].model
    page = staff_client.get(url(model, "changelist"))
    assert page.status_code == 200
    shown = page.context["cl"].queryset
    path = TEAM_PATHS[label]
    assert shown.filter(**{path: team_a.pk}).exists()
    assert not shown.exclude(**{path: team_a.pk}).exists()


@pytest.mark.parametrize("label", sorted(TEAM_PATHS))
def test_no_admin_list_names_another_team_not_even_in_its_filter_sidebar(label: str, staff_client: Client,
                                                                        world: dict[str, Any]) -> None:
    model = next(m for m in admin.site._registry if m._meta.label_lower == label)
    page = staff_client.get(url(model, "changelist")).content.decode()
    assert "Team B" not in page and "team-b" not in page


def test_the_filter_sidebars_offer_the_staff_members_own_teams_and_a_superuser_every_team(
        staff_client: Client, world: dict[str, Any], alice: Any) -> None:
    from django.contrib.auth.models import User

    from webapp.accounts.models import do_create_team

    do_create_team("Team C", alice)  # a filter shows from two choices on
    for model in (APIQuota, User):  # by team; by group (a user's teams)
        sidebar = staff_client.get(url(model, "changelist")).content.decode().split('id="changelist-filter"')[-1]
        assert "Team A" in sidebar and "Team C" in sidebar, model
        assert "Team B" not in sidebar and "team-b" not in sidebar, model
    root = Client()
    root.force_login(get_user_model().objects.create_superuser("root", password="x" * 20))
    sidebar = root.get(url(APIQuota, "changelist")).content.decode().split('id="changelist-filter"')[-1]
    assert "Team A" in sidebar and "Team B" in sidebar


@pytest.mark.parametrize("label", sorted(TEAM_PATHS))
def test_every_admin_form_offers_only_the_staff_members_teams_rows(label: str, staff_client: Client,
                                                                   world: dict[str, Any], team_a: Team) -> None:
    model = next(m for m in admin.site._registry if m._meta.label_lower == label)
    own = model._default_manager.filter(**{TEAM_PATHS[label]: team_a.pk}).first()
    page = staff_client.get(url(model, "change", own.pk))
    assert page.status_code == 200
    forms = [page.context["adminform"].form]
    forms += [f.form for formset in page.context["inline_admin_formsets"] for f in formset]
    for form in forms:
        for name, field in form.fields.items():
            related = getattr(field, "queryset", None)
            if not isinstance(field, ModelChoiceField) or related.model._meta.label_lower not in TEAM_PATHS:
                continue
            if name == form._meta.model._meta.pk.name:
                continue  # an inline row's hidden own id: Django saves only rows of the formset's own queryset
            rel_label = related.model._meta.label_lower
            foreign = related.exclude(**{TEAM_PATHS[rel_label]: team_a.pk})
            if rel_label in {"registry.entry", "registry.version"}:  # built-ins may be picked by every team
                foreign = foreign.exclude(**{f"{TEAM_PATHS[rel_label]}__isnull": True})
            assert not foreign.exists(), f"{label}.{name} offers {list(foreign)}"


def test_a_staff_member_cannot_hand_out_privileges_or_see_superusers(staff_client: Client, alice: Any,
                                                                      team_a: Team) -> None:
    root = get_user_model().objects.create_superuser("root", password="x" * 20)
    team_a.add_member(root)
    carol = get_user_model().objects.create_user("carol")
    team_a.add_member(carol)
    users = staff_client.get(url(get_user_model(), "changelist")).context["cl"].queryset
    assert sorted(u.username for u in users) == ["alice", "carol"]  # not bob (team B), not root
    assert staff_client.get(url(get_user_model(), "change", root.pk)).status_code == 302
    assert staff_client.get(url(get_user_model(), "add")).status_code == 403
    form = staff_client.get(url(get_user_model(), "change", carol.pk)).context["adminform"].form
    assert {"is_superuser", "is_staff", "user_permissions", "groups"}.isdisjoint(form.fields)
    group_form = staff_client.get(url(Group, "change", team_a.group.pk)).context["adminform"].form
    assert "permissions" not in group_form.fields


def test_editing_a_user_of_the_staff_members_teams_keeps_their_teams(staff_client: Client, team_a: Team) -> None:
    carol = get_user_model().objects.create_user("carol")
    team_a.add_member(carol)
    response = staff_client.post(url(get_user_model(), "change", carol.pk), {
        "username": "carol", "first_name": "Carol", "last_name": "", "email": "", "is_active": "on",
        "groups": [], "last_login_0": "", "last_login_1": "", "date_joined_0": "2026-01-01",
        "date_joined_1": "00:00:00",
    })
    assert response.status_code == 302, response.context["adminform"].form.errors
    carol.refresh_from_db()
    assert carol.first_name == "Carol"
    assert [t.name for t in Team.objects.of(carol)] == ["Team A"]  # groups are read-only for staff


def test_a_staff_member_cannot_make_a_built_in_entry(staff_client: Client, team_a: Team) -> None:
    response = staff_client.post(url(Entry, "add"), {"kind": "tool", "team": "", "import_path": "tools_a:x",
                                                     "name": "x", "status": "pending",
                                                     "versions-TOTAL_FORMS": "0", "versions-INITIAL_FORMS": "0"})
    assert response.status_code == 200
    assert "This field is required." in " ".join(response.context["adminform"].form.errors["team"])
    assert not Entry.objects.filter(import_path="tools_a:x").exists()


def test_login_attempts_and_api_tokens_are_for_superusers_only(staff_client: Client) -> None:
    from axes.models import AccessAttempt
    from rest_framework.authtoken.models import TokenProxy

    assert staff_client.get(url(AccessAttempt, "changelist")).status_code == 403
    assert staff_client.get(url(TokenProxy, "changelist")).status_code == 403


def test_a_superuser_still_sees_every_team(world: dict[str, Any]) -> None:
    root = Client()
    root.force_login(get_user_model().objects.create_superuser("root", password="x" * 20))
    assert root.get(url(TrainingJob, "changelist")).context["cl"].queryset.count() == 2
    assert Invitation.objects.count() == 2
    form = root.get(url(Checkpoint, "add")).context["adminform"].form
    assert form.fields["job"].queryset.count() == 2
