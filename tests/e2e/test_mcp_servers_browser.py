"""The MCP server pages in Chromium, against Daphne and the session's worker: alice registers a script of her
team's folder through the form, watches its inspection finish, reads its tools' schemas, calls one, and sees
the job that uses it, at a laptop's and a phone's size; bob gets a 404. Screenshots land in
``test-artifacts/mcp/``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import agentfly as af
from tests.e2e.conftest import watch_for_problems
from tests.e2e.pagecheck import SIZES, layout_problems
from tests.webapp.helpers import Daphne, sign_in, wait_for_js
from tests.webapp.registry.test_registry_security import plugin_file

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

STORE = Path(af.__file__).parent / "resources" / "mcp_servers" / "kv_store.py"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "mcp"


@pytest.fixture
def kv_job(alice: Any, team_a: Any, transactional_db: None) -> Any:
    """A job of alice's team whose config names the server ``kv`` (made before the browser's loop starts)."""
    from webapp.jobs.models import TrainingJob

    return TrainingJob.objects.create(team=team_a, created_by=alice, name="kv agent", config={
        "steps": 2, "mcp": {"kv": {"command": ["kv_server.py"], "tools": ["put"]}}})


def test_a_team_registers_inspects_tries_and_sees_the_jobs_of_its_mcp_server_on_a_laptop_and_a_phone(
        alice: Any, bob: Any, kv_job: Any, worker: Any, daphne: Daphne, browser_page: Any) -> None:
    page = browser_page
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.set_viewport_size(SIZES["laptop"])
    sign_in(page, alice, daphne.url)
    problems = watch_for_problems(page, daphne.url)
    with plugin_file("team-a/kv_server.py", STORE.read_text()):
        page.goto(f"{daphne.url}/mcp/")
        page.click("#register-link")
        assert page.input_value("#id_command") == ""  # not the API form's "null"
        page.fill("#id_name", "kv")
        page.fill("#id_command", "kv_server.py")
        page.click("#register-server button[type=submit]")
        page.wait_for_url(lambda url: "/register/" not in url)
        assert "Inspecting" in page.inner_text("#server-status-badge")
        # The worker starts the server in the sandbox; the page polls and reloads when it is done.
        wait_for_js(page, "() => !!document.querySelector('#tools')", timeout=120_000)
        assert page.inner_text("#server-status-badge") == "Ready"
        page.click("#tool-put summary")
        assert '"required"' in page.inner_text("#tool-put")
        assert "kv agent" in page.inner_text("#jobs-using")

        page.select_option("#id_tool", "put")
        page.fill("#id_arguments", '{"key": "a", "value": "<b>1</b>"}')
        page.click("#try button[type=submit]")
        wait_for_js(page, "() => !!document.querySelector('#observation')", timeout=60_000)
        assert page.inner_text("#observation") == "ok"
        page.fill("#id_arguments", '{"key": 1}')
        page.click("#try button[type=submit]")
        wait_for_js(page, "() => (document.querySelector('#observation') || {}).textContent?.includes('required')",
                    timeout=60_000)

        server_path = page.url.removeprefix(daphne.url)
        shots: dict[str, list[str]] = {}
        for size in SIZES:
            page.set_viewport_size(SIZES[size])
            for name, path in (("list", "/mcp/"), ("register", "/mcp/register/"), ("server", server_path)):
                page.goto(f"{daphne.url}{path}")
                page.wait_for_load_state("networkidle")
                if name == "server":
                    page.click("#tool-put summary")
                page.screenshot(path=str(ARTIFACTS / f"{size}-{name}.png"), full_page=True)
                shots[f"{size} {name}"] = layout_problems(page)
        assert {k: v for k, v in shots.items() if v} == {}
    assert problems == []

    page.context.clear_cookies()
    sign_in(page, bob, daphne.url)
    assert page.goto(f"{daphne.url}{server_path}").status == 404
    page.goto(f"{daphne.url}/mcp/")
    assert "kv_server.py" not in page.inner_text("main")
