"""The launch form's judge fields in a real browser: the judge's directory, server and rubric show only for
the place the judge runs, and the server list holds the judge servers the operator allows the user's team
(``AGENTFLY_JUDGE_SERVERS``). Debian's Chromium via Playwright, Daphne."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.webapp.helpers import Daphne, sign_in_with_the_form

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

JUDGE_SERVERS = {"*": {"http://judge1:8000": "/srv/models/judge"}, "team-b": {"http://judge-b:8000": "/srv/models/b"}}


@pytest.fixture
def judge_servers_of_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """The setting as Daphne reads it from its environment (asked for before ``daphne``, which copies it)."""
    monkeypatch.setenv("AGENTFLY_JUDGE_SERVERS", json.dumps(JUDGE_SERVERS))


def test_the_judge_fields_follow_where_the_judge_runs_and_offer_only_the_team_s_servers(
        judge_servers_of_the_server: None, alice_for_the_server: Any, daphne: Daphne, browser_page: Any) -> None:
    from playwright.sync_api import expect

    page = browser_page
    page.set_default_timeout(30_000)
    sign_in_with_the_form(page, daphne.url, next_path="/jobs/launch/")
    fields = {name: page.locator(f'.field[data-field="{name}"]')
              for name in ("judge_model_path", "judge_server", "judge_rubric")}
    expect(page.locator("#id_judge_source")).to_have_value("")
    for box in fields.values():
        expect(box).to_be_hidden()

    page.select_option("#id_judge_source", "server")
    expect(fields["judge_server"]).to_be_visible()
    expect(fields["judge_rubric"]).to_be_visible()
    expect(fields["judge_model_path"]).to_be_hidden()
    options = page.eval_on_selector_all("#id_judge_server option", "(os) => os.map((o) => o.value)")
    assert options == ["", "http://judge1:8000"], options  # team-b's server is not alice's to choose

    page.select_option("#id_judge_source", "path")
    expect(fields["judge_model_path"]).to_be_visible()
    expect(fields["judge_server"]).to_be_hidden()
    assert not page.errors, page.errors
