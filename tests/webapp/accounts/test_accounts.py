"""Sign up, sign in, teams: a user sees only the teams they belong to."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from tests.webapp.helpers import PASSWORD
from webapp.accounts.models import MembershipInvitation, Team, TeamNameTaken, do_create_team


def signup(client: Client, **overrides: str) -> Any:
    data = {"username": "carol", "password1": PASSWORD, "password2": PASSWORD, "team_name": "", **overrides}
    return client.post(reverse("accounts:signup"), data)


def test_signing_up_creates_a_personal_team_and_signs_the_user_in(client: Client, db: None) -> None:
    response = signup(client)
    assert response.status_code == 302 and response["Location"] == reverse("jobs:list")
    carol = get_user_model().objects.get(username="carol")
    assert [t.name for t in Team.objects.of(carol)] == ["carol's team"]
    assert client.get(reverse("jobs:list")).status_code == 200


def test_signing_up_with_a_team_name_creates_that_team(client: Client, db: None) -> None:
    signup(client, team_name="Robotics Lab")
    team = Team.objects.get(group__name="Robotics Lab")
    assert team.slug == "robotics-lab" and [u.username for u in team.members] == ["carol"]


@pytest.mark.parametrize(("overrides", "field", "message"), [
    ({"username": ""}, "username", "This field is required."),
    ({"username": "bad name!"}, "username", "Enter a valid username"),
    ({"username": "alice"}, "username", "already exists"),
    ({"password2": "something else"}, "password2", "didn’t match"),
    ({"password1": "123", "password2": "123"}, "password2", "too short"),
    ({"team_name": "Team A"}, "team_name", "already exists"),
    ({"team_name": "x" * 81}, "team_name", "at most 80 characters"),
])
def test_bad_signup_input_is_refused_on_its_field(client: Client, alice: Any, overrides: dict[str, str],
                                                  field: str, message: str) -> None:
    response = signup(client, **overrides)
    assert response.status_code == 200
    assert message in " ".join(response.context["form"].errors[field])
    assert list(get_user_model().objects.values_list("username", flat=True)) == ["alice"]


def test_signing_in_with_a_wrong_password_is_refused(client: Client, alice: Any) -> None:
    response = client.post(reverse("login"), {"username": "alice", "password": "wrong"})
    assert response.status_code == 200 and "correct username and password" in response.content.decode()
    assert client.post(reverse("login"), {"username": "alice", "password": PASSWORD}).status_code == 302


def test_a_member_invites_a_colleague_who_sees_the_teams_jobs_once_they_accept(alice_client: Client, team_a: Any,
                                                                               bob: Any, bob_client: Client) -> None:
    from webapp.jobs.models import TrainingJob

    TrainingJob.objects.create(team=team_a, name="shared run", config={})
    response = alice_client.post(reverse("accounts:add_member", args=[team_a.slug]), {"username": "bob"})
    assert response.status_code == 302
    assert not team_a.has_member(bob)
    invitation = MembershipInvitation.objects.get(team=team_a, invitee=bob)
    assert "Team A" in bob_client.get(reverse("accounts:invitations")).content.decode()
    response = bob_client.post(reverse("accounts:accept_invitation", args=[invitation.pk]))
    assert response.status_code == 302 and team_a.has_member(bob)
    assert "shared run" in bob_client.get(reverse("jobs:list")).content.decode()


def test_a_user_cannot_see_or_join_a_team_they_are_not_in(bob_client: Client, team_a: Any, bob: Any) -> None:
    assert bob_client.get(reverse("accounts:team", args=[team_a.slug])).status_code == 404
    response = bob_client.post(reverse("accounts:add_member", args=[team_a.slug]), {"username": "bob"})
    assert response.status_code == 404 and not team_a.has_member(bob)
    assert "Team A" not in bob_client.get(reverse("accounts:teams")).content.decode()


def test_creating_a_team_twice_with_one_name_is_refused(alice: Any, alice_client: Client) -> None:
    with pytest.raises(TeamNameTaken, match="already exists"):
        do_create_team("Team A", alice)
    response = alice_client.post(reverse("accounts:teams"), {"name": "  "})
    assert "This field is required." in " ".join(response.context["form"].errors["name"])
    assert alice_client.post(reverse("accounts:teams"), {"name": "Vision"}).status_code == 302
    assert sorted(t.name for t in Team.objects.of(alice)) == ["Team A", "Vision"]


def test_a_user_sees_their_api_token_and_can_replace_it(alice_client: Client, alice: Any) -> None:
    from rest_framework.authtoken.models import Token

    page = alice_client.get(reverse("accounts:token")).content.decode()
    old = Token.objects.get(user=alice).key
    assert old in page
    assert alice_client.post(reverse("accounts:token")).status_code == 302
    new = Token.objects.get(user=alice).key
    assert new != old
    api = Client()
    assert api.get("/api/jobs/", HTTP_AUTHORIZATION=f"Token {old}").status_code == 401
    assert api.get("/api/jobs/", HTTP_AUTHORIZATION=f"Token {new}").status_code == 200
