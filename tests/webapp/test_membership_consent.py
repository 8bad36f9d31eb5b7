"""Membership needs consent, staff reach only users of their own teams, a password change ends what it should.

One test per accounts attack of issue 28: adding a user to a team without asking them, a team's staff member
setting the password of a user who is also in another team, a token that outlived a password change, and a
team named like a shared plugin package.
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
from webapp.accounts.models import MembershipInvitation, Team, do_create_team

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
