"""Low-severity attacks of issue 28 on the web layer: what a team lookup tells, who may open a websocket, and
whose word the server takes for the scheme."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from tests.webapp.helpers import ROOT


def test_another_teams_slug_and_an_unknown_slug_get_the_same_answer(alice_api: Any, team_a: Any,
                                                                      team_b: Any) -> None:
    answers = []
    for slug in (team_b.slug, "no-such-team"):
        for url, data in (("/api/registry/", {"kind": "tool", "import_path": "team_tools:x", "team": slug}),
                          ("/api/invitations/", {"team": slug}),
                          ("/api/team-invitations/", {"team": slug, "username": "bob"})):
            response = alice_api.post(url, data, format="json")
            assert response.status_code == 400
            answers.append(response.json()["team"][0].replace(slug, "SLUG"))
    assert answers[:3] == answers[3:]
    assert "does not exist or you are not a member" in answers[0]


@pytest.mark.parametrize(("origin", "why"), [
    (b"https://agentfly.example:9999", "another port of the same host"),
    (b"https://agentfly.example", "the default port, not the one the site is on"),
    (b"http://agentfly.example:8443", "plain http to the https port"),
    (b"https://evil.example:8443", "another host"),
    (b"null", "an opaque origin"),
])
def test_a_websocket_from_any_other_origin_is_refused_at_the_handshake(settings: Any, origin: bytes,
                                                                             why: str) -> None:
    from webapp.origin import origin_allowed

    settings.ALLOWED_HOSTS = ["agentfly.example"]
    scope = {"type": "websocket", "scheme": "wss", "headers": [(b"host", b"agentfly.example:8443"), (b"origin", origin)]}
    assert not origin_allowed(scope), why
    assert origin_allowed({**scope, "headers": [(b"host", b"agentfly.example:8443"),
                                                (b"origin", b"https://agentfly.example:8443")]})


@pytest.mark.parametrize(("proxies", "status"), [("0", 301), ("1", 404)])  # 404: served, over "https"
def test_x_forwarded_proto_is_trusted_only_behind_the_configured_proxies(proxies: str, status: int) -> None:
    clean = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "SECRET_KEY", "ALLOWED_HOSTS"}}
    env = {**clean, "DEBUG": "0", "SECRET_KEY": "k" * 50, "ALLOWED_HOSTS": "agentfly.example",
           "SECURE_SSL_REDIRECT": "1", "AGENTFLY_NUM_PROXIES": proxies, "PYTHONPATH": str(ROOT)}
    code = ("import django; django.setup(); from django.test import Client; "
            "print(Client().get('/api/nothing-here/', HTTP_HOST='agentfly.example', HTTP_X_FORWARDED_PROTO='https').status_code)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**env, "DJANGO_SETTINGS_MODULE": "webapp.settings"},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    # With no proxy configured, the header is the client's own claim: the plain-http request is sent to https.
    assert result.stdout.strip().splitlines()[-1] == str(status)
