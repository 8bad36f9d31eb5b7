"""``manage.py createuser``: a user and their team for a new deployment, the password from standard input."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from webapp.accounts.models import Team


def create(monkeypatch: pytest.MonkeyPatch, *args: str, password: str | None = None) -> str:
    monkeypatch.setattr("sys.stdin", io.StringIO((password or "") + "\n"))
    out = io.StringIO()
    call_command("createuser", *args, *(["--password-stdin"] if password else []), stdout=out)
    return out.getvalue()


def test_createuser_makes_the_team_with_the_user_as_its_admin_and_the_password_works(
        db: None, monkeypatch: pytest.MonkeyPatch) -> None:
    out = create(monkeypatch, "carol", "--team", "Stack Team", password="a-long-pass-phrase-9")
    assert out.strip() == "created user carol in team stack-team (admin)"
    user = get_user_model().objects.get(username="carol")
    assert user.check_password("a-long-pass-phrase-9") and Team.objects.get(slug="stack-team").is_admin(user)


def test_createuser_joins_an_existing_team_and_refuses_a_taken_name_or_a_weak_password(
        alice: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    assert create(monkeypatch, "dave", "--team", "Team A").strip() == "created user dave in team team-a (member)"
    team = Team.objects.get(slug="team-a")
    assert team.members.filter(username="dave").exists() and not team.admins.filter(username="dave").exists()
    assert create(monkeypatch, "frank", "--team", "Team A", "--admin").strip().endswith("(admin)")
    with pytest.raises(CommandError, match="a user named 'alice' already exists"):
        create(monkeypatch, "alice", "--team", "Team A")
    with pytest.raises(CommandError, match="password refused"):
        create(monkeypatch, "erin", "--team", "Team A", password="123")
