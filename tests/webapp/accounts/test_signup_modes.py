"""Accounts are deliberate: AGENTFLY_SIGNUP open / invite / closed, and single-use team invitations."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from tests.webapp.helpers import PASSWORD, ROOT
from webapp.accounts.models import Invitation, Team, do_create_invitation


def sign_up(client: Client, url: str, username: str = "carol", **extra: str) -> Any:
    return client.post(url, {"username": username, "password1": PASSWORD, "password2": PASSWORD, **extra})


def invitation_link(alice_client: Client, team: Team) -> str:
    """Create an invitation on the team page, as a member does, and read the link it shows once."""
    assert alice_client.post(reverse("accounts:invite", args=[team.slug])).status_code == 302
    page = alice_client.get(reverse("accounts:team", args=[team.slug])).content.decode()
    link = re.search(r'value="(http[^"]+)" id="new-invitation-link"', page)
    assert link, page
    assert "shown only now" in page
    # Shown once: the secret is stored only as a hash.
    assert link.group(1) not in alice_client.get(reverse("accounts:team", args=[team.slug])).content.decode()
    return link.group(1).removeprefix("http://testserver")


def usernames() -> list[str]:
    return sorted(get_user_model().objects.values_list("username", flat=True))


def test_sign_up_without_an_invitation_is_refused_when_signup_is_invite(client: Client, alice: Any,
                                                                        settings: Any) -> None:
    settings.AGENTFLY_SIGNUP = "invite"
    page = client.get(reverse("accounts:signup"))
    assert page.status_code == 403
    text = page.content.decode()
    assert "by invitation only" in text and "invitation link on their team page" in text
    assert sign_up(client, reverse("accounts:signup")).status_code == 403
    assert usernames() == ["alice"]
    login = client.get(reverse("login")).content.decode()
    assert "Ask a member of your team for an invitation link" in login and reverse("accounts:signup") not in login


def test_an_invitation_link_signs_up_into_its_team_once(client: Client, alice_client: Client, team_a: Team,
                                                        settings: Any) -> None:
    settings.AGENTFLY_SIGNUP = "invite"
    link = invitation_link(alice_client, team_a)
    page = client.get(link)
    assert page.status_code == 200 and "invited to join <strong>Team A</strong>" in page.content.decode()
    assert "team_name" not in page.context["form"].fields  # the invitation decides the team

    response = sign_up(client, link)
    assert response.status_code == 302 and response["Location"] == reverse("jobs:list")
    carol = get_user_model().objects.get(username="carol")
    assert [t.name for t in Team.objects.of(carol)] == ["Team A"]
    assert client.get(reverse("accounts:team", args=[team_a.slug])).status_code == 200
    invitation = Invitation.objects.get(team=team_a)
    assert invitation.state == "used" and invitation.used_by == carol

    again = sign_up(Client(), link, username="dave")
    assert again.status_code == 403 and "already used" in again.content.decode()
    assert usernames() == ["alice", "carol"]
    assert "used by carol" in alice_client.get(reverse("accounts:team", args=[team_a.slug])).content.decode()


def test_an_invitation_also_joins_its_team_when_signup_is_open(client: Client, alice_client: Client,
                                                               team_a: Team) -> None:
    sign_up(client, invitation_link(alice_client, team_a))
    assert [t.name for t in Team.objects.of(get_user_model().objects.get(username="carol"))] == ["Team A"]


def test_an_expired_invitation_is_refused(client: Client, alice: Any, team_a: Team, settings: Any) -> None:
    settings.AGENTFLY_SIGNUP = "invite"
    settings.AGENTFLY_INVITE_DAYS = 2
    invitation, token = do_create_invitation(team_a, alice)
    assert timedelta(days=2) - (invitation.expires_at - timezone.now()) < timedelta(minutes=1)
    Invitation.objects.filter(pk=invitation.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    link = reverse("accounts:signup_invited", args=[token])
    for response in (client.get(link), sign_up(client, link)):
        assert response.status_code == 403
        assert "This invitation expired on" in response.content.decode()
        assert "ask a member of Team A for a new one" in response.content.decode()
    assert usernames() == ["alice"]


def test_a_revoked_or_made_up_invitation_is_refused(client: Client, alice_client: Client, team_a: Team,
                                                    settings: Any) -> None:
    settings.AGENTFLY_SIGNUP = "invite"
    link = invitation_link(alice_client, team_a)
    invitation = Invitation.objects.get(team=team_a)
    assert alice_client.post(reverse("accounts:revoke_invitation", args=[team_a.slug, invitation.pk])).status_code == 302
    refused = sign_up(client, link)
    assert refused.status_code == 403 and "This invitation was revoked" in refused.content.decode()
    made_up = client.get(reverse("accounts:signup_invited", args=["not-a-real-token"]))
    assert made_up.status_code == 403 and "not valid" in made_up.content.decode()
    assert usernames() == ["alice"]


def test_bob_cannot_invite_into_team_a(alice: Any, team_a: Team, bob_client: Client, bob: Any,
                                       team_b: Team) -> None:
    assert bob_client.post(reverse("accounts:invite", args=[team_a.slug])).status_code == 404
    assert not Invitation.objects.filter(team=team_a).exists()
    with pytest.raises(PermissionDenied, match="only members of Team A"):
        do_create_invitation(team_a, bob)

    invitation, _ = do_create_invitation(team_a, alice)
    revoke = reverse("accounts:revoke_invitation", args=[team_a.slug, invitation.pk])
    assert bob_client.post(revoke).status_code == 404
    # Nor through his own team's address.
    assert bob_client.post(reverse("accounts:revoke_invitation", args=[team_b.slug, invitation.pk])).status_code == 404
    invitation.refresh_from_db()
    assert invitation.state == "pending"
    assert bob_client.get(reverse("accounts:team", args=[team_a.slug])).status_code == 404
    do_create_invitation(team_b, bob)
    own_page = bob_client.get(reverse("accounts:team", args=[team_b.slug]))
    assert [i.team for i in own_page.context["invitations"]] == [team_b]


def test_signup_closed_refuses_every_sign_up(client: Client, alice: Any, alice_client: Client, team_a: Team,
                                             settings: Any) -> None:
    _, token = do_create_invitation(team_a, alice)  # made while sign-up was open
    settings.AGENTFLY_SIGNUP = "closed"
    for response in (client.get(reverse("accounts:signup")), sign_up(client, reverse("accounts:signup")),
                     sign_up(client, reverse("accounts:signup_invited", args=[token]))):
        assert response.status_code == 403
        assert "Sign-up is closed on this server: an administrator creates accounts" in response.content.decode()
    assert usernames() == ["alice"]
    refused = alice_client.post(reverse("accounts:invite", args=[team_a.slug]), follow=True).content.decode()
    assert "No invitation was created" in refused and "AGENTFLY_SIGNUP=closed" in refused
    assert Invitation.objects.filter(team=team_a).count() == 1
    assert reverse("accounts:signup") not in client.get(reverse("login")).content.decode()


def settings_in_subprocess(env: dict[str, str], expression: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "SECRET_KEY", "AGENTFLY_SIGNUP"}}
    code = f"import webapp.settings as s; print({expression})"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**clean, **env}, capture_output=True,
                          text=True, timeout=60)


def test_debug_off_defaults_signup_to_invite() -> None:
    production = settings_in_subprocess({"DEBUG": "0", "SECRET_KEY": "k" * 50}, "s.AGENTFLY_SIGNUP")
    assert production.returncode == 0, production.stderr
    assert production.stdout.strip() == "invite"
    assert settings_in_subprocess({"DEBUG": "1"}, "s.AGENTFLY_SIGNUP").stdout.strip() == "open"
    closed = settings_in_subprocess({"DEBUG": "0", "SECRET_KEY": "k" * 50, "AGENTFLY_SIGNUP": "closed"},
                                    "s.AGENTFLY_SIGNUP")
    assert closed.stdout.strip() == "closed"
    bad = settings_in_subprocess({"DEBUG": "1", "AGENTFLY_SIGNUP": "anyone"}, "s.AGENTFLY_SIGNUP")
    assert bad.returncode != 0
    assert "AGENTFLY_SIGNUP='anyone' is not one of open, invite, closed" in bad.stderr


def test_the_demo_keeps_signup_open(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    import argparse

    from webapp import demo

    monkeypatch.delenv("AGENTFLY_SIGNUP", raising=False)
    # configure_environment sets the demo's environment in this process (DEBUG, SECRET_KEY, cookies without
    # Secure, ...): all of it is put back after, or later tests would see the demo's settings.
    with mock.patch.dict(os.environ):
        env = demo.configure_environment(argparse.Namespace(dir=str(tmp_path), debug=False), demo.Services(tmp_path))
    assert env["AGENTFLY_SIGNUP"] == "open"
    assert "SESSION_COOKIE_SECURE" not in os.environ or os.environ["SESSION_COOKIE_SECURE"] != "0"


def test_the_api_creates_lists_and_revokes_invitations_of_the_users_teams_only(
        alice_api: Any, bob_api: Any, team_a: Team, team_b: Team, settings: Any) -> None:
    settings.AGENTFLY_SIGNUP = "invite"
    created = alice_api.post("/api/invitations/", {"team": team_a.slug}, format="json")
    assert created.status_code == 201 and created.json()["state"] == "pending"
    link = created.json()["link"].removeprefix("http://testserver")
    assert "link" not in alice_api.get("/api/invitations/").json()["results"][0]  # shown once
    assert [i["team"] for i in alice_api.get("/api/invitations/").json()["results"]] == ["team-a"]

    refused = bob_api.post("/api/invitations/", {"team": team_a.slug}, format="json")
    assert refused.status_code == 400 and "does not exist or you are not a member" in refused.json()["team"][0]
    assert bob_api.get("/api/invitations/").json()["results"] == []
    pk = created.json()["id"]
    assert bob_api.post(f"/api/invitations/{pk}/revoke/").status_code == 404

    assert sign_up(Client(), link).status_code == 302
    assert alice_api.post(f"/api/invitations/{pk}/revoke/").json()["state"] == "used"
    settings.AGENTFLY_SIGNUP = "closed"
    closed = alice_api.post("/api/invitations/", {"team": team_a.slug}, format="json")
    assert closed.status_code == 409 and "AGENTFLY_SIGNUP=closed" in closed.json()["detail"]
