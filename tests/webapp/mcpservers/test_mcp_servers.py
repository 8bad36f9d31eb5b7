"""A team registers an MCP server: each refusal names its setting, a worker lists the tools of an allowed one
in the sandbox, the tools can be tried, and another team can neither see nor try it."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

import agentfly as af
from tests.webapp.helpers import wait_for
from tests.webapp.registry.test_registry_security import plugin_file
from webapp.mcpservers.models import MCPServer, Status

STORE = Path(af.__file__).parent / "resources" / "mcp_servers" / "kv_store.py"


def register(api: Any, team: str = "team-a", **fields: Any) -> Any:
    return api.post("/api/mcp-servers/", {"team": team, "name": "kv", **fields}, format="json")


@pytest.mark.parametrize(("command", "named"), [
    (["bash", "-c", "python3 -m http.server"], "`bash -c`"),
    (["python", "-c", "import os; os.system('id')"], "`python -c`"),
    (["npx", "-y", "@modelcontextprotocol/server-everything"], "`npx <anything>`"),
    (["../../../etc/passwd.py"], "outside your team's plugin folder"),
    (["/usr/lib/python3/dist-packages/some_server.py"], "not a .py path relative to your team's plugin folder"),
])
def test_a_stdio_server_outside_the_rules_is_refused_with_the_setting_named(
        alice_api: Any, team_a: Any, command: list[str], named: str) -> None:
    with plugin_file("team-a/placeholder.py", "x = 1\n"):
        response = register(alice_api, transport="stdio", command=command)
    assert response.status_code == 400, response.content
    message = " ".join(response.json()["command"])
    assert named in message and "AGENTFLY_MCP_COMMANDS" in message
    assert not MCPServer.objects.exists()


def test_an_operator_allowlisted_exact_argv_is_accepted_and_no_other(alice_api: Any, team_a: Any,
                                                                      settings: Any) -> None:
    settings.AGENTFLY_MCP_COMMANDS = [["uvx", "mcp-server-time"]]
    assert register(alice_api, transport="stdio", command=["uvx", "mcp-server-time", "--x"]).status_code == 400
    assert register(alice_api, transport="stdio", command=["uvx", "mcp-server-time"]).status_code == 202


def test_an_http_url_must_be_on_the_allowlist_and_loopback_needs_its_own_setting(alice_api: Any, team_a: Any,
                                                                                 settings: Any) -> None:
    url = "http://127.0.0.1:8765/mcp"
    off = register(alice_api, transport="http", url=url)
    assert off.status_code == 400 and "AGENTFLY_MCP_URLS" in " ".join(off.json()["url"])
    settings.AGENTFLY_MCP_URLS = ["http://127.0.0.1:8765/"]
    local = register(alice_api, transport="http", url=url)
    assert local.status_code == 400 and "AGENTFLY_MCP_LOCAL_HOSTS" in " ".join(local.json()["url"])
    settings.AGENTFLY_MCP_LOCAL_HOSTS = ["127.0.0.1"]
    assert register(alice_api, transport="http", url=url).status_code == 202


@pytest.mark.parametrize("url", ["http://[::1", "http://a:99999/mcp", "ftp://x/", "", "http:///mcp"])
def test_a_malformed_url_is_a_400_not_a_crash(alice_api: Any, team_a: Any, url: str) -> None:
    response = register(alice_api, transport="http", url=url)
    assert response.status_code == 400 and response.json()["url"]


def test_a_link_local_address_is_refused_like_loopback(alice_api: Any, team_a: Any, settings: Any) -> None:
    settings.AGENTFLY_MCP_URLS = ["http://169.254.169.254/"]
    response = register(alice_api, transport="http", url="http://169.254.169.254/latest/meta-data")
    assert response.status_code == 400 and "AGENTFLY_MCP_LOCAL_HOSTS" in " ".join(response.json()["url"])


def test_a_team_cannot_register_a_server_for_another_team(bob_api: Any, team_a: Any, team_b: Any) -> None:
    response = register(bob_api, team="team-a", transport="stdio", command=["kv.py"])
    assert response.status_code == 400 and "team" in response.json()


@pytest.mark.slow
def test_a_registered_stdio_server_is_listed_in_the_sandbox_tried_and_hidden_from_other_teams(
        transactional_db: None, worker: Any, alice: Any, bob: Any, alice_api: Any, bob_api: Any) -> None:
    from webapp.accounts.models import Team

    Team.objects.of(alice).get()
    with plugin_file("team-a/kv_server.py", STORE.read_text()):
        response = register(alice_api, transport="stdio", command=["kv_server.py"])
        assert response.status_code == 202, response.content
        server_id = response.json()["id"]
        server = wait_for(lambda: MCPServer.objects.filter(pk=server_id).exclude(status=Status.PENDING).first(),
                          90, "the worker to list the server's tools")
        assert server.status == Status.READY, server.error
        assert server.current_version is not None
        tools = {t["name"]: t for t in server.current_version.tools}
        assert {"put", "get", "lookup"} <= set(tools)
        assert tools["put"]["input_schema"]["required"] == ["key", "value"]

        tried = alice_api.post(f"/api/mcp-servers/{server_id}/try/",
                               {"tool": "put", "arguments": {"key": "a", "value": "1"}}, format="json")
        assert tried.status_code == 200 and tried.json()["observation"] == "ok", tried.content
        bad = alice_api.post(f"/api/mcp-servers/{server_id}/try/", {"tool": "put", "arguments": {"key": 1}},
                             format="json")
        assert bad.status_code == 200 and "'value' is a required property" in bad.json()["error"]

        # Bob's team neither sees, reads nor tries it.
        assert bob_api.get("/api/mcp-servers/").json()["results"] == []
        assert bob_api.get(f"/api/mcp-servers/{server_id}/").status_code == 404
        assert bob_api.post(f"/api/mcp-servers/{server_id}/try/", {"tool": "put", "arguments": {}},
                            format="json").status_code == 404


def test_the_settings_default_to_nothing_allowed() -> None:
    assert settings.AGENTFLY_MCP_URLS == [] and settings.AGENTFLY_MCP_COMMANDS == []
    assert settings.AGENTFLY_MCP_LOCAL_HOSTS == [] and settings.AGENTFLY_MCP_NETWORK == []
    assert socket.gethostbyname("127.0.0.1") == "127.0.0.1"


def test_a_reset_or_seed_tool_the_server_does_not_list_fails_its_inspection_naming_the_listing(team_a: Any) -> None:
    from webapp.mcpservers.rules import NotAllowed
    from webapp.mcpservers.tasks import check_named_tools

    server = MCPServer(team=team_a, name="kv", transport="stdio", command=["kv.py"], reset_tool="reset",
                       seed_tool="load")
    with pytest.raises(NotAllowed, match=r"lists no seed_tool 'load'; it lists put, reset: register it again"):
        check_named_tools(server, [{"name": "put"}, {"name": "reset"}])
    check_named_tools(MCPServer(team=team_a, name="kv", reset_tool="reset"), [{"name": "reset"}])


# ---------------------------------------------------------------------------- URLs are parsed, not prefixes
def test_a_url_with_userinfo_is_refused_though_its_text_starts_with_an_allowed_entry(
        alice_api: Any, team_a: Any, settings: Any) -> None:
    settings.AGENTFLY_MCP_URLS = ["http://127.0.0.1:8153"]
    settings.AGENTFLY_MCP_LOCAL_HOSTS = ["127.0.0.1"]
    response = register(alice_api, transport="http", url="http://127.0.0.1:8153@127.0.0.1:8154/steal")
    assert response.status_code == 400 and "user name or password" in " ".join(response.json()["url"])
    assert not MCPServer.objects.exists()


@pytest.mark.parametrize("url", ["http://[::ffff:127.0.0.1]:8765/mcp", "http://[::ffff:169.254.169.254]/latest",
                                 "http://2130706433:8765/mcp", "http://[::ffff:7f00:1]:8765/mcp"])
def test_an_address_inside_another_form_is_refused_like_the_address_it_is(
        alice_api: Any, team_a: Any, settings: Any, url: str) -> None:
    settings.AGENTFLY_MCP_URLS = [url]  # on the allowlist: only the local-address check stands in the way
    response = register(alice_api, transport="http", url=url)
    assert response.status_code == 400 and "AGENTFLY_MCP_LOCAL_HOSTS" in " ".join(response.json()["url"])


def test_an_allowlist_entry_allows_paths_under_its_own_on_a_segment_boundary_and_on_its_origin_only(
        alice_api: Any, team_a: Any, settings: Any) -> None:
    settings.AGENTFLY_MCP_URLS = ["http://127.0.0.1:8765/mcp"]
    settings.AGENTFLY_MCP_LOCAL_HOSTS = ["127.0.0.1"]
    for refused in ["http://127.0.0.1:8765/mcpx", "http://127.0.0.1:8766/mcp", "https://127.0.0.1:8765/mcp",
                    "http://127.0.0.1:8765/mcp/../admin"]:
        response = register(alice_api, transport="http", url=refused)
        assert response.status_code == 400, refused
    assert register(alice_api, transport="http", url="http://127.0.0.1:8765/mcp/v1").status_code == 202


def test_the_answer_of_an_internal_service_never_comes_back_in_the_inspection_error(
        alice_api: Any, team_a: Any, settings: Any) -> None:
    from tests.integration.resources.test_mcp_http_endpoint import SECRET, serving_a_secret
    from webapp.mcpservers.tasks import inspect_mcp_server

    with serving_a_secret() as (port, hosts):
        settings.AGENTFLY_MCP_URLS = [f"http://127.0.0.1:{port}/"]
        settings.AGENTFLY_MCP_LOCAL_HOSTS = ["127.0.0.1"]
        response = register(alice_api, transport="http", url=f"http://127.0.0.1:{port}/steal")
        assert response.status_code == 202, response.content
        assert inspect_mcp_server(response.json()["id"]) == "failed"
    assert hosts, "the inspection never reached the service"
    shown = alice_api.get(f"/api/mcp-servers/{response.json()['id']}/").json()
    assert shown["status"] == "failed" and "not an MCP session" in shown["error"]
    assert SECRET not in json.dumps(shown)


def test_registering_for_a_missing_team_and_for_another_team_get_the_same_answer(
        alice_api: Any, team_a: Any, team_b: Any) -> None:
    answers = [register(alice_api, team=slug, transport="stdio", command=["kv.py"]) for slug in ("team-b", "no-team")]
    assert [a.status_code for a in answers] == [400, 400]
    messages = [" ".join(a.json()["team"]).replace(slug, "<slug>") for a, slug in zip(answers, ("team-b", "no-team"),
                                                                                      strict=True)]
    assert messages[0] == messages[1] and "does not exist or you are not a member" in messages[0]


# ---------------------------------------------------------------------------- inspections: own queue, bounded
STUCK = "import time\ntime.sleep(600)  # never answers: an MCP server that does not start\n"


def test_a_teams_inspections_beyond_its_limit_are_refused_while_another_team_still_registers(
        alice_api: Any, bob_api: Any, team_a: Any, team_b: Any, settings: Any) -> None:
    settings.AGENTFLY_MCP_INSPECT_TEAM_CONCURRENCY = 1
    with plugin_file("team-a/stuck.py", STUCK), plugin_file("team-b/stuck.py", STUCK):
        assert register(alice_api, name="stuck1", transport="stdio", command=["stuck.py"]).status_code == 202
        for n in range(2, 7):  # six registrations whose server never starts: one inspection, five refusals
            refused = register(alice_api, name=f"stuck{n}", transport="stdio", command=["stuck.py"])
            assert refused.status_code == 429
            assert "AGENTFLY_MCP_INSPECT_TEAM_CONCURRENCY=1" in refused.json()["detail"]
        assert register(bob_api, team="team-b", name="stuck1", transport="stdio",
                        command=["stuck.py"]).status_code == 202
    assert MCPServer.objects.filter(team=team_a).count() == 1


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_inspection_of_a_server_that_never_starts_fails_within_its_timeout_and_frees_its_place(
        alice: Any, alice_api: Any, team_a: Any, settings: Any) -> None:
    from webapp.mcpservers.actions import take_inspection_slot
    from webapp.mcpservers.tasks import inspect_mcp_server

    settings.AGENTFLY_MCP_INSPECT_TEAM_CONCURRENCY = 1
    with plugin_file("team-a/stuck.py", STUCK):
        server = MCPServer.objects.create(team=team_a, name="stuck", transport="stdio", command=["stuck.py"],
                                          created_by=alice)
        slot = take_inspection_slot(team_a, alice)  # the place its registration took
        assert register(alice_api, name="other", transport="stdio", command=["stuck.py"]).status_code == 429
        assert inspect_mcp_server(server.pk, slot=slot, timeout=3.0) == "failed"  # as the inspect worker runs it
        server.refresh_from_db()
        assert server.status == Status.FAILED
        assert "did not list its tools within AGENTFLY_MCP_INSPECT_TIMEOUT=3 s" in server.error
        assert register(alice_api, name="other", transport="stdio", command=["stuck.py"]).status_code == 202


def test_an_inspection_is_sent_to_the_inspect_queue_with_a_hard_time_limit(
        alice_api: Any, team_a: Any, settings: Any, django_capture_on_commit_callbacks: Any) -> None:
    settings.AGENTFLY_MCP_INSPECT_TIMEOUT = 20.0
    sent: list[dict[str, Any]] = []

    def record(sender: Any = None, headers: Any = None, routing_key: Any = None, **_: Any) -> None:
        sent.append({"task": sender, "queue": routing_key, "limits": (headers or {}).get("timelimit")})

    from celery.signals import before_task_publish

    before_task_publish.connect(record, weak=False)
    try:
        with plugin_file("team-a/kv_server.py", STORE.read_text()), \
                django_capture_on_commit_callbacks(execute=True):
            assert register(alice_api, transport="stdio", command=["kv_server.py"]).status_code == 202
    finally:
        before_task_publish.disconnect(record)
    # A worker that takes it finds no row (this test's transaction is rolled back) and returns "gone".
    assert sent == [{"task": "webapp.mcpservers.tasks.inspect_mcp_server", "queue": "inspect",
                     "limits": [50.0, 35.0]}]


# ---------------------------------------------------------------------------- "try it" says what is missing
def test_try_it_on_a_ready_entry_without_a_version_says_what_is_missing_not_that_it_is_not_ready(
        alice_api: Any, team_a: Any, alice: Any) -> None:
    from tests.webapp.factories import ready_entry
    from webapp.registry.models import Kind

    entry = ready_entry(team_a, Kind.TOOL, "tools_a:echo", "echo")
    entry.current_version.delete()  # a version deleted in the admin: the entry stays ready, with none
    entry.refresh_from_db()
    server = MCPServer.objects.create(team=team_a, name="kv", transport="stdio", command=["kv.py"],
                                      status=Status.READY, created_by=alice)
    answers = [alice_api.post(f"/api/registry/{entry.pk}/try/", {"arguments": {}}, format="json"),
               alice_api.post(f"/api/mcp-servers/{server.pk}/try/", {"tool": "put", "arguments": {}}, format="json")]
    for answer in answers:
        assert answer.status_code == 409
        detail = answer.json()["detail"]
        assert "no inspected version to try" in detail and "register it again" in detail
        assert "once it is ready" not in detail
    pending = MCPServer.objects.create(team=team_a, name="kv2", transport="stdio", command=["kv.py"], created_by=alice)
    detail = alice_api.post(f"/api/mcp-servers/{pending.pk}/try/", {"tool": "put"}, format="json").json()["detail"]
    assert detail == "This server is pending; it can be tried once its inspection has succeeded."
