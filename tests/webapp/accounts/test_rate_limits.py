"""Rate limits: django-axes locks out password guessing; DRF throttles (counted in Redis) cap the token
endpoint, "try it", launches, sign-ups and every API call, on the API and the HTML pages alike."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from django.test import Client
from django.urls import reverse

from tests.webapp.factories import launch_data, ready_entry
from tests.webapp.helpers import PASSWORD, ROOT, Daphne
from webapp.registry.models import Entry, EntryStatus, Kind


def wrong_login(client: Client, username: str = "alice") -> Any:
    return client.post(reverse("login"), {"username": username, "password": "wrong"})


def test_login_is_locked_out_after_the_failure_limit(client: Client, alice: Any, bob: Any, settings: Any) -> None:
    settings.AXES_FAILURE_LIMIT = 3
    for _ in range(2):
        assert wrong_login(client).status_code == 200  # the form's own "enter a correct username" error
    locked = wrong_login(client)
    assert locked.status_code == 429
    assert int(locked["Retry-After"]) == 15 * 60
    text = locked.content.decode()
    assert "3 wrong passwords were given for “alice”" in text and "Try again in 15 minutes" in text
    # The right password no longer helps while the lock holds ...
    assert client.post(reverse("login"), {"username": "alice", "password": PASSWORD}).status_code == 429
    assert "_auth_user_id" not in client.session
    # ... but the lock is on alice from this address, not on everyone who signs in from it.
    assert client.post(reverse("login"), {"username": "bob", "password": PASSWORD}).status_code == 302


def test_the_token_endpoint_is_locked_out_too(alice: Any, settings: Any) -> None:
    settings.AXES_FAILURE_LIMIT = 3
    api = Client()
    for _ in range(2):
        response = api.post("/api/token/", {"username": "alice", "password": "wrong"})
        assert response.status_code == 400 and "Unable to log in" in response.content.decode()
    locked = api.post("/api/token/", {"username": "alice", "password": "wrong"})
    assert locked.status_code == 429 and locked["Retry-After"] == str(15 * 60)
    assert "try again in 15 minutes" in locked.json()["detail"]
    assert api.post("/api/token/", {"username": "alice", "password": PASSWORD}).status_code == 429
    # One lock for the pair, whichever door was used.
    assert Client().post(reverse("login"), {"username": "alice", "password": PASSWORD}).status_code == 429


def test_a_successful_login_clears_the_failure_count(client: Client, alice: Any, settings: Any) -> None:
    settings.AXES_FAILURE_LIMIT = 3
    wrong_login(client), wrong_login(client)
    assert client.post(reverse("login"), {"username": "alice", "password": PASSWORD}).status_code == 302
    client.logout()
    wrong_login(client), wrong_login(client)
    assert client.post(reverse("login"), {"username": "alice", "password": PASSWORD}).status_code == 302


def test_the_token_endpoint_is_throttled_beyond_its_rate(alice: Any, rate_limits: Any) -> None:
    rate_limits({"token": "2/minute"})
    api = Client()
    for _ in range(2):
        assert api.post("/api/token/", {"username": "alice", "password": PASSWORD}).status_code == 200
    refused = api.post("/api/token/", {"username": "alice", "password": PASSWORD})
    assert refused.status_code == 429 and "throttled" in refused.json()["detail"]
    assert 0 < int(refused["Retry-After"]) <= 60


def test_the_token_rate_is_counted_across_processes_in_redis(rate_limits: Any) -> None:
    """Another web process spends the budget; this one refuses the next request."""
    rate_limits({"token": "2/minute"})
    code = ("import django; django.setup(); from django.test.utils import setup_test_environment; "
            "setup_test_environment(); from django.test import Client; c = Client(); "
            "print([c.post('/api/token/', {}).status_code for _ in range(2)])")
    other = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                           env={**os.environ, "AGENTFLY_RATE_TOKEN": "2/minute", "PYTHONPATH": str(ROOT)})
    assert other.returncode == 0, other.stderr
    assert other.stdout.strip().splitlines()[-1] == "[400, 400]"  # counted, then refused for missing fields
    assert Client().post("/api/token/", {}).status_code == 429


def test_the_api_throttles_try_it_beyond_its_rate(alice: Any, alice_api: Any, alice_client: Client,
                                                   bob: Any, bob_api: Any, team_a: Any, team_b: Any,
                                                   rate_limits: Any) -> None:
    rate_limits({"try": "2/minute"})
    # Entries still being inspected answer at once (409), so no worker is needed to count the calls.
    pending = Entry.objects.create(team=team_a, kind=Kind.TOOL, import_path="tools_a:echo", status=EntryStatus.PENDING)
    url = f"/api/registry/{pending.pk}/try/"
    for _ in range(2):
        assert alice_api.post(url, {"arguments": {}}, format="json").status_code == 409
    refused = alice_api.post(url, {"arguments": {}}, format="json")
    assert refused.status_code == 429 and "Expected available in" in refused.json()["detail"]
    # The page's "try it" button draws on the same budget ...
    ready = ready_entry(team_a, Kind.TOOL, "tools_a:echo2", "echo2")
    page = alice_client.post(reverse("registry:try", args=[ready.pk]), {"arguments": "{}"}, HTTP_HX_REQUEST="true")
    assert page.status_code == 429 and "limit of 2/minute &quot;try it&quot; calls" in page.content.decode()
    assert "AGENTFLY_RATE_TRY" in page.content.decode() and int(page["Retry-After"]) > 0
    # ... and bob's budget is his own.
    bobs = Entry.objects.create(team=team_b, kind=Kind.TOOL, import_path="tools_b:echo", status=EntryStatus.PENDING)
    assert bob_api.post(f"/api/registry/{bobs.pk}/try/", {"arguments": {}}, format="json").status_code == 409


def test_the_api_throttles_launches_beyond_their_rate(alice_api: Any, alice_client: Client, team_a: Any,
                                                      rate_limits: Any) -> None:
    rate_limits({"launch": "2/minute"})
    tool = ready_entry(None, Kind.TOOL, "agentfly.tools.builtin.calculator:calculator", "calculator")
    reward = ready_entry(None, Kind.REWARD, "agentfly.rewards.builtin.math:math_equal", "math_equal")
    bad = launch_data(team_a, tool, reward, steps=0)  # refused by the form: counted, but nothing queued
    for _ in range(2):
        assert alice_api.post("/api/jobs/", bad, format="json").status_code == 400
    refused = alice_api.post("/api/jobs/", bad, format="json")
    assert refused.status_code == 429
    page = alice_client.post(reverse("jobs:launch"), bad)
    assert page.status_code == 429 and "job launches" in page.content.decode()
    assert alice_client.get(reverse("jobs:launch")).status_code == 200  # showing the form is not a launch
    assert alice_api.get("/api/jobs/").status_code == 200  # nor is reading


def test_sign_up_is_throttled_per_address(client: Client, db: None, rate_limits: Any) -> None:
    rate_limits({"signup": "2/hour"})
    for _ in range(2):
        assert client.post(reverse("accounts:signup"), {"username": ""}).status_code == 200
    refused = Client().post(reverse("accounts:signup"), {"username": "carol", "password1": PASSWORD,
                                                         "password2": PASSWORD})
    assert refused.status_code == 429 and "sign-ups from your address" in refused.content.decode()
    assert "Try again in" in refused.content.decode()


def test_creating_teams_is_throttled_per_person(alice_client: Client, bob_client: Client, rate_limits: Any) -> None:
    rate_limits({"team": "2/hour"})
    for name in ("Vision", "Audio"):
        assert alice_client.post(reverse("accounts:teams"), {"name": name}).status_code == 302
    refused = alice_client.post(reverse("accounts:teams"), {"name": "Speech"})
    assert refused.status_code == 429 and "AGENTFLY_RATE_TEAM" in refused.content.decode()
    assert alice_client.get(reverse("accounts:teams")).status_code == 200  # the page itself stays open
    assert bob_client.post(reverse("accounts:teams"), {"name": "Speech"}).status_code == 302


def test_a_person_may_create_only_so_many_teams(alice_client: Client, alice: Any, settings: Any) -> None:
    from webapp.accounts.models import Team

    settings.AGENTFLY_TEAMS_PER_USER = 2  # alice's sign-up team is her first
    assert alice_client.post(reverse("accounts:teams"), {"name": "Vision"}).status_code == 302
    refused = alice_client.post(reverse("accounts:teams"), {"name": "Audio"})
    assert refused.status_code == 400
    assert "as many as one person may (AGENTFLY_TEAMS_PER_USER=2)" in refused.content.decode()
    assert not Team.objects.filter(slug="audio").exists()


def test_every_api_call_counts_against_the_user_rate(alice_api: Any, bob_api: Any, rate_limits: Any) -> None:
    rate_limits({"user": "3/minute"})
    assert [alice_api.get("/api/jobs/").status_code for _ in range(4)] == [200, 200, 200, 429]
    assert bob_api.get("/api/jobs/").status_code == 200


def test_anonymous_api_calls_count_against_the_anon_rate(db: None, rate_limits: Any) -> None:
    rate_limits({"anon": "1/minute"})
    anonymous = Client()
    assert anonymous.get("/api/schema/").status_code == 200
    assert anonymous.get("/api/schema/").status_code == 429


def test_a_forwarded_for_header_does_not_buy_a_fresh_budget(alice: Any, rate_limits: Any) -> None:
    rate_limits({"token": "1/minute"})
    api = Client()
    assert api.post("/api/token/", {}, HTTP_X_FORWARDED_FOR="10.0.0.1").status_code == 400
    assert api.post("/api/token/", {}, HTTP_X_FORWARDED_FOR="10.0.0.2").status_code == 429


def test_daphne_serves_the_lockout_page_too(daphne: Daphne, alice: Any) -> None:
    web_server = daphne.url
    """Production runs the ASGI stack, where django-axes' middleware takes its async path."""
    import http.cookiejar
    import re
    import urllib.error
    import urllib.parse
    import urllib.request

    from django.contrib.auth.hashers import make_password

    # The server process checks passwords with Django's default hashers, not the tests' fast MD5.
    alice.password = make_password(PASSWORD, hasher="pbkdf2_sha256")
    alice.save()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))

    def attempt(password: str) -> tuple[int, str, str | None]:
        page = opener.open(f"{web_server}/login/", timeout=30).read().decode()
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
        body = urllib.parse.urlencode({"username": "alice", "password": password, "csrfmiddlewaretoken": csrf})
        try:
            response = opener.open(urllib.request.Request(f"{web_server}/login/", data=body.encode()), timeout=30)
            return response.status, response.read().decode(), None
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(), exc.headers.get("Retry-After")

    status, text, _ = attempt(PASSWORD)
    assert status == 200 and "Sign out" in text  # the server does check alice's password
    failures = [attempt("wrong") for _ in range(4)]
    assert [status for status, _, _ in failures] == [200] * 4 and "correct username" in failures[0][1]
    status, text, retry_after = attempt("wrong")
    assert status == 429 and "Try again in 15 minutes" in text and retry_after == str(15 * 60)
    status, text, _ = attempt(PASSWORD)
    assert status == 429 and "Sign-in locked" in text


def test_a_malformed_rate_stops_the_server_naming_the_variable() -> None:
    env = {**os.environ, "DEBUG": "1", "AGENTFLY_RATE_TRY": "30 per minute"}
    result = subprocess.run([sys.executable, "-c", "import webapp.settings"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "AGENTFLY_RATE_TRY='30 per minute' is not a rate; write it as N/second, N/minute" in result.stderr
