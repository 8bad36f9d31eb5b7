"""Membership needs consent, only a team's admins manage its members, staff reach only users of the teams they
administer, a password change ends what it should.

One test per accounts attack of issue 28: adding a user to a team without asking them, a plain member
inviting, revoking or removing (and each way around it: the page, the API, the admin), a team's staff member
setting the password of a user who is also in another team or of a team they are only a member of, a token
that outlived a password change, and a team named like a shared plugin package.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from tests.webapp.helpers import PASSWORD
from webapp.accounts.models import (
    Invitation,
    MembershipInvitation,
    Team,
    do_create_invitation,
    do_create_team,
)

NEW_PASSWORD = "a different horse battery staple"


@pytest.fixture
def carol(db: None, team_a: Team) -> Any:
    """carol is in team A (alice's) and in her own team C."""
    carol = get_user_model().objects.create_user("carol", password=PASSWORD)
    team_a.add_member(carol)
    do_create_team("Team C", carol)
    return carol


@pytest.fixture
def staff_alice(alice: Any) -> Client:
    """alice as staff of team A with the permission to change users, in her own client."""
    alice.is_staff = True
    alice.save()
    alice.user_permissions.set(Permission.objects.filter(codename__in=["change_user", "view_user"]))
    client = Client()
    client.force_login(get_user_model().objects.get(pk=alice.pk))
    return client


@pytest.fixture
def dave(team_a: Team) -> Any:
    """dave is a plain member of team A (alice's): not one of its admins."""
    dave = get_user_model().objects.create_user("dave", password=PASSWORD)
    team_a.add_member(dave)
    return dave


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def api_for(user: Any) -> APIClient:
    api = APIClient()
    api.force_authenticate(user)
    return api


def test_posting_a_username_to_a_team_invites_them_instead_of_adding_them(alice_client: Client, team_a: Team,
                                                                          bob: Any, bob_client: Client) -> None:
    response = alice_client.post(reverse("accounts:add_member", args=[team_a.slug]), {"username": "bob"})
    assert response.status_code == 302
    assert not team_a.has_member(bob)
    assert "Team A" not in bob_client.get(reverse("accounts:teams")).content.decode().split("Invitations")[-1]
    invitation = MembershipInvitation.objects.get(team=team_a, invitee=bob)
    assert invitation.state == "pending"
    bob_client.post(reverse("accounts:decline_invitation", args=[invitation.pk]))
    assert not team_a.has_member(bob)
    invitation.refresh_from_db()
    assert invitation.state == "declined"
    # A declined invitation cannot be accepted afterwards.
    bob_client.post(reverse("accounts:accept_invitation", args=[invitation.pk]))
    assert not team_a.has_member(bob)


def test_only_the_invitee_can_accept_an_invitation(alice_client: Client, team_a: Team, bob: Any) -> None:
    alice_client.post(reverse("accounts:add_member", args=[team_a.slug]), {"username": "bob"})
    invitation = MembershipInvitation.objects.get(team=team_a, invitee=bob)
    assert alice_client.post(reverse("accounts:accept_invitation", args=[invitation.pk])).status_code == 404
    assert not team_a.has_member(bob)


def test_the_api_invites_and_only_the_invitee_accepts(alice: Any, bob: Any, team_a: Team, team_b: Team) -> None:
    alice_api, bob_api = api_for(alice), api_for(bob)
    response = alice_api.post("/api/team-invitations/", {"team": team_a.slug, "username": "bob"}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["state"] == "pending" and not team_a.has_member(bob)
    pk = response.json()["id"]
    assert alice_api.post(f"/api/team-invitations/{pk}/accept/").status_code == 404
    assert [i["team"] for i in bob_api.get("/api/team-invitations/").json()["results"]] == [team_a.slug]
    response = bob_api.post(f"/api/team-invitations/{pk}/accept/")
    assert response.status_code == 200 and response.json()["state"] == "accepted"
    assert team_a.has_member(bob)
    assert bob_api.post(f"/api/team-invitations/{pk}/accept/").status_code == 409
    # Into another team's slug: refused as for any team the caller is not in.
    response = alice_api.post("/api/team-invitations/", {"team": team_b.slug, "username": "alice"}, format="json")
    assert response.status_code == 400


def test_inviting_a_made_up_username_answers_exactly_as_inviting_a_real_one(
        alice: Any, alice_client: Client, bob: Any, team_a: Team) -> None:
    import re

    alice_api = api_for(alice)
    real = alice_api.post("/api/team-invitations/", {"team": team_a.slug, "username": "bob"}, format="json")
    made_up = alice_api.post("/api/team-invitations/", {"team": team_a.slug, "username": "nobody-here"},
                             format="json")
    assert real.status_code == made_up.status_code == 201

    def shape(body: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in body.items() if k not in ("id", "created_at", "invitee")}

    assert shape(real.json()) == shape(made_up.json())
    assert (real.json()["invitee"], made_up.json()["invitee"]) == ("bob", "nobody-here")
    # The page's answer and the team's list of invitations read the same for both names.
    pages = [alice_client.post(reverse("accounts:add_member", args=[team_a.slug]), {"username": name}, follow=True)
             for name in ("bob", "nobody-here")]
    texts = [re.sub(r"\s+", " ", page.content.decode()) for page in pages]
    for name, text in zip(("bob", "nobody-here"), texts, strict=True):
        assert f"{name} is invited to Team A; they join once" in text
        assert re.search(rf'<tr class="member-invitation pending"><td>{name}</td><td>alice</td><td>pending</td>', text)
    # The made-up name's invitation is addressed to nobody: a user who takes that name later does not get it.
    later = get_user_model().objects.create_user("nobody-here", password=PASSWORD)
    assert not MembershipInvitation.objects.to(later).exists()
    assert MembershipInvitation.objects.get(team=team_a, invitee_name="nobody-here").invitee is None


def test_a_teams_staff_member_cannot_set_the_password_of_a_user_also_in_another_team(
        staff_alice: Client, carol: Any) -> None:
    page = staff_alice.post(reverse("admin:auth_user_password_change", args=[carol.pk]),
                            {"password1": NEW_PASSWORD, "password2": NEW_PASSWORD, "usable_password": "true"})
    assert page.status_code in (302, 404)
    carol.refresh_from_db()
    assert carol.check_password(PASSWORD) and not carol.check_password(NEW_PASSWORD)
    changelist = staff_alice.get(reverse("admin:auth_user_changelist")).context["cl"].queryset
    assert "carol" not in {u.username for u in changelist}


def test_a_staff_member_of_every_team_of_a_user_may_change_their_password(staff_alice: Client, team_a: Team) -> None:
    dave = get_user_model().objects.create_user("dave", password=PASSWORD)
    team_a.add_member(dave)
    page = staff_alice.post(reverse("admin:auth_user_password_change", args=[dave.pk]),
                            {"password1": NEW_PASSWORD, "password2": NEW_PASSWORD, "usable_password": "true"})
    assert page.status_code == 302
    dave.refresh_from_db()
    assert dave.check_password(NEW_PASSWORD)


def test_a_password_change_revokes_the_api_token_and_other_sessions(alice: Any) -> None:
    from rest_framework.authtoken.models import Token

    token = Token.objects.create(user=alice).key
    other_session = Client()
    other_session.force_login(alice)
    assert other_session.get(reverse("jobs:list")).status_code == 200
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert api.get("/api/jobs/").status_code == 200

    user = get_user_model().objects.get(pk=alice.pk)
    user.set_password(NEW_PASSWORD)
    user.save()

    assert api.get("/api/jobs/").status_code == 401
    assert not Token.objects.filter(user=alice).exists()
    assert other_session.get(reverse("jobs:list")).status_code == 302  # back to the sign-in page


def test_a_team_cannot_take_the_name_of_a_shared_plugin_package(alice: Any, settings: Any, tmp_path: Any) -> None:
    plugins = tmp_path / "plugins"
    (plugins / "text_utils").mkdir(parents=True)
    (plugins / "text_utils" / "__init__.py").write_text("")
    settings.AGENTFLY_PLUGIN_DIRS = [plugins]
    settings.AGENTFLY_TOOL_PACKAGES = ["lab_tools"]
    assert do_create_team("text_utils", alice).slug == "team-text_utils"
    assert do_create_team("lab-tools", alice).slug == "team-lab-tools"
    assert do_create_team("admin", alice).slug == "team-admin"
    from django.core.exceptions import ValidationError

    team = do_create_team("harmless", alice)
    team.slug = "text_utils"
    with pytest.raises(ValidationError, match="shared plugin package"):
        team.full_clean()


def test_rehashing_the_same_password_at_sign_in_keeps_the_token(alice: Any, settings: Any) -> None:
    from django.contrib.auth.hashers import make_password
    from rest_framework.authtoken.models import Token

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher",
                                 "django.contrib.auth.hashers.MD5PasswordHasher"]
    alice.password = make_password(PASSWORD, hasher="md5")
    alice.save()
    token = Token.objects.create(user=alice).key
    get_user_model().objects.get(pk=alice.pk).check_password(PASSWORD)  # upgrades the hash to PBKDF2
    assert get_user_model().objects.get(pk=alice.pk).password.startswith("pbkdf2_sha256$")
    assert Token.objects.filter(key=token).exists()


# ------------------------------------------------------------------------------------------ team admins
def test_a_teams_creator_is_its_admin_and_a_member_who_joins_is_not(alice: Any, team_a: Team, dave: Any) -> None:
    assert team_a.is_admin(alice) and not team_a.is_admin(dave)
    assert list(Team.objects.administered_by(alice)) == [team_a]
    assert not Team.objects.administered_by(dave).exists()


def test_a_plain_member_inviting_is_refused_with_the_admins_named(team_a: Team, dave: Any, bob: Any) -> None:
    page = client_for(dave).post(reverse("accounts:add_member", args=[team_a.slug]), {"username": "bob"})
    assert page.status_code == 403
    text = page.content.decode()
    assert "Only the admins of Team A can invite members (its admins: alice)" in text
    link = client_for(dave).post(reverse("accounts:invite", args=[team_a.slug]))
    assert link.status_code == 403 and "only the admins of Team A can create invitation links" in link.content.decode()
    api = api_for(dave)
    for url, data in (("/api/team-invitations/", {"team": team_a.slug, "username": "bob"}),
                      ("/api/invitations/", {"team": team_a.slug})):
        response = api.post(url, data, format="json")
        assert response.status_code == 403, response.content
        assert "(its admins: alice)" in response.json()["detail"]
    assert not MembershipInvitation.objects.exists() and not Invitation.objects.exists()
    # The team page offers a plain member no invitation form.
    shown = client_for(dave).get(reverse("accounts:team", args=[team_a.slug])).content.decode()
    assert f'action="{reverse("accounts:add_member", args=[team_a.slug])}"' not in shown
    assert f'action="{reverse("accounts:invite", args=[team_a.slug])}"' not in shown


def test_a_plain_member_cannot_revoke_an_invitation(alice: Any, team_a: Team, dave: Any) -> None:
    invitation, _ = do_create_invitation(team_a, alice)
    page = client_for(dave).post(reverse("accounts:revoke_invitation", args=[team_a.slug, invitation.pk]))
    assert page.status_code == 403 and "only the admins of Team A can revoke invitations" in page.content.decode()
    response = api_for(dave).post(f"/api/invitations/{invitation.pk}/revoke/")
    assert response.status_code == 403 and "admins" in response.json()["detail"]
    invitation.refresh_from_db()
    assert invitation.state == "pending"


def test_an_admin_makes_a_member_an_admin_who_then_invites(alice_client: Client, team_a: Team, dave: Any,
                                                           bob: Any) -> None:
    assert client_for(dave).post(reverse("accounts:make_admin", args=[team_a.slug, "dave"])).status_code == 403
    assert not team_a.is_admin(dave)  # not by himself
    assert alice_client.post(reverse("accounts:make_admin", args=[team_a.slug, "dave"])).status_code == 302
    assert team_a.is_admin(dave)
    assert client_for(dave).post(reverse("accounts:add_member", args=[team_a.slug]), {"username": "bob"}).status_code == 302
    assert MembershipInvitation.objects.get(team=team_a, invitee=bob).state == "pending"


def test_only_an_admin_removes_a_member_and_the_last_admin_cannot_go(alice: Any, alice_client: Client, team_a: Team,
                                                                     dave: Any) -> None:
    erin = get_user_model().objects.create_user("erin", password=PASSWORD)
    team_a.add_member(erin)
    refused = client_for(dave).post(reverse("accounts:remove_member", args=[team_a.slug, "erin"]))
    assert refused.status_code == 403 and "Only the admins of Team A can remove members" in refused.content.decode()
    assert team_a.has_member(erin)
    assert alice_client.post(reverse("accounts:remove_member", args=[team_a.slug, "erin"])).status_code == 302
    assert not team_a.has_member(erin)
    # A member may leave on their own.
    assert client_for(dave).post(reverse("accounts:remove_member", args=[team_a.slug, "dave"])).status_code == 302
    assert not team_a.has_member(dave)
    last = alice_client.post(reverse("accounts:remove_member", args=[team_a.slug, "alice"]), follow=True)
    assert "alice is the last admin of Team A" in last.content.decode()
    assert team_a.is_admin(alice)


def test_staff_who_are_only_members_of_alices_team_cannot_change_her_password(alice: Any, team_a: Team,
                                                                              dave: Any) -> None:
    dave.is_staff = True
    dave.save()
    dave.user_permissions.set(Permission.objects.filter(
        codename__in=["change_user", "view_user", "change_team", "view_team", "change_invitation", "view_invitation"]))
    staff = client_for(get_user_model().objects.get(pk=dave.pk))
    page = staff.post(reverse("admin:auth_user_password_change", args=[alice.pk]),
                      {"password1": NEW_PASSWORD, "password2": NEW_PASSWORD, "usable_password": "true"})
    assert page.status_code in (302, 404)
    alice.refresh_from_db()
    assert alice.check_password(PASSWORD) and not alice.check_password(NEW_PASSWORD)
    assert not staff.get(reverse("admin:auth_user_changelist")).context["cl"].queryset.exists()
    # Nor can he make himself the team's admin in the admin, nor manage its invitations there.
    form = staff.get(reverse("admin:accounts_team_change", args=[team_a.pk])).context["adminform"].form
    assert "admins" not in form.fields
    staff.post(reverse("admin:accounts_team_change", args=[team_a.pk]),
               {"group": team_a.group.pk, "slug": team_a.slug, "created_by": alice.pk, "admins": [dave.pk]})
    assert not team_a.is_admin(dave)
    do_create_invitation(team_a, alice)
    assert not staff.get(reverse("admin:accounts_invitation_changelist")).context["cl"].queryset.exists()


def test_teams_made_before_roles_get_their_creator_or_else_every_member_as_admin(alice: Any, team_a: Team,
                                                                                 dave: Any, bob: Any,
                                                                                 team_b: Team) -> None:
    import importlib

    from django.apps import apps

    first_admins = importlib.import_module("webapp.accounts.migrations.0004_team_admins").first_admins
    team_a.admins.clear()
    team_b.admins.clear()
    team_b.created_by = None  # its creator's account is gone
    team_b.save()
    team_b.add_member(dave)
    first_admins(apps, None)
    assert list(team_a.admins.order_by("username").values_list("username", flat=True)) == ["alice"]
    assert list(team_b.admins.order_by("username").values_list("username", flat=True)) == ["bob", "dave"]


def test_the_demo_user_administers_the_demo_team(db: None) -> None:
    from webapp.demo import demo_user

    user, team = demo_user()
    assert team.is_admin(user)
    assert demo_user()[1] == team  # a restart finds the same team, still administered
    assert team.is_admin(user)
