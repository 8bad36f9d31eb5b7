"""Registration input is checked in the web process before anything is queued."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from webapp.registry.models import Entry, Kind, Version


@pytest.mark.parametrize(("field", "value", "message"), [
    ("import_path", "", "This field is required."),
    ("import_path", "just_a_module", "is not an import path"),
    ("import_path", "pkg.mod:fn; import os", "is not an import path"),
    ("import_path", "../etc/passwd:x", "is not an import path"),
    ("import_path", "x" * 301, "at most 300 characters"),
    ("kind", "plugin", "Select a valid choice"),
    ("team", "999999", "Select a valid choice"),
])
def test_bad_registration_input_is_refused_on_its_field(alice_client: Any, team_a: Any, field: str, value: str,
                                                        message: str) -> None:
    data = {"kind": "tool", "import_path": "team_tools:word_count", "team": team_a.pk, field: value}
    response = alice_client.post(reverse("registry:register"), data)
    assert response.status_code == 400
    assert message in " ".join(response.context["form"].errors[field])
    assert not Entry.objects.exists()


def test_a_user_cannot_register_for_a_team_they_are_not_in(alice_client: Any, team_b: Any) -> None:
    response = alice_client.post(reverse("registry:register"),
                                 {"kind": "tool", "import_path": "team_tools:word_count", "team": team_b.pk})
    assert response.status_code == 400
    assert "team" in response.context["form"].errors
    assert not Entry.objects.exists()


@pytest.mark.parametrize(("payload", "field"), [
    ({"kind": "tool", "import_path": "nope", "team": "team-a"}, "import_path"),
    ({"kind": "gadget", "import_path": "a:b", "team": "team-a"}, "kind"),
    ({"kind": "tool", "import_path": "a:b", "team": "team-b"}, "team"),
    ({"kind": "tool", "import_path": "a:b", "team": "no-such-team"}, "team"),
    ({"kind": "tool", "team": "team-a"}, "import_path"),
])
def test_bad_registration_input_through_the_api_names_the_field(alice_api: Any, team_a: Any, team_b: Any,
                                                                payload: dict[str, Any], field: str) -> None:
    response = alice_api.post("/api/registry/", payload, format="json")
    assert response.status_code == 400
    assert field in response.json()
    assert not Entry.objects.exists()


def entry_of(team: Any) -> Entry:
    entry = Entry.objects.create(team=team, kind=Kind.TOOL, import_path="team_tools:word_count", name="word_count",
                                 status="ready")
    entry.current_version = Version.objects.create(entry=entry, source_hash="a" * 64, name="word_count",
                                                   signature="word_count(text: str) -> int")
    entry.save()
    return entry


def test_a_user_of_team_a_can_neither_see_nor_use_team_bs_entries(alice_client: Any, alice_api: Any,
                                                                  team_b: Any) -> None:
    entry = entry_of(team_b)
    assert "team_tools:word_count" not in alice_client.get(reverse("registry:list")).content.decode()
    assert alice_client.get(reverse("registry:detail", args=[entry.pk])).status_code == 404
    assert alice_client.post(reverse("registry:try", args=[entry.pk]), {"arguments": "{}"}).status_code == 404
    assert alice_client.post(reverse("registry:reinspect", args=[entry.pk])).status_code == 404
    assert alice_api.get("/api/registry/").json()["results"] == []
    assert alice_api.get(f"/api/registry/{entry.pk}/").status_code == 404
    assert alice_api.post(f"/api/registry/{entry.pk}/try/", {"arguments": {}}, format="json").status_code == 404


def test_pages_and_api_require_a_signed_in_user(client: Any, db: None) -> None:
    assert client.get(reverse("registry:list")).status_code == 302
    assert client.get("/api/registry/").status_code in (401, 403)
