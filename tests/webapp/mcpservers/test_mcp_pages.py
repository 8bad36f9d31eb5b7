"""The MCP server pages: the register form refuses what the rule refuses with the rule's own words, a team's
pages list only its servers, and another team's server is a 404 on every page."""

from __future__ import annotations

from typing import Any

from tests.webapp.registry.test_registry_security import plugin_file
from webapp.mcpservers.models import MCPServer, MCPServerVersion, Status

TOOLS = [{"name": "put", "description": "Store a value.",
          "input_schema": {"type": "object", "properties": {"key": {"type": "string"}, "value": {"type": "string"}},
                           "required": ["key", "value"]}}]


def ready_server(team: Any, name: str = "kv") -> MCPServer:
    server = MCPServer.objects.create(team=team, name=name, transport="stdio", command=["kv_server.py"],
                                      status=Status.READY)
    server.current_version = MCPServerVersion.objects.create(server=server, listing_hash="a" * 64, tools=TOOLS)
    server.save(update_fields=["current_version"])
    return server


def test_the_register_form_refuses_a_shell_command_naming_the_setting_that_would_allow_it(
        alice_client: Any, team_a: Any) -> None:
    with plugin_file("team-a/placeholder.py", "x = 1\n"):
        response = alice_client.post("/mcp/register/", {"team": team_a.pk, "name": "kv", "transport": "stdio",
                                                        "command": "bash -c 'python3 -m http.server'"})
    assert response.status_code == 400
    assert "`bash -c` is not an MCP server AgentFly may start" in response.content.decode()
    assert "AGENTFLY_MCP_COMMANDS" in response.content.decode()
    assert not MCPServer.objects.exists()


def test_the_register_form_asks_for_the_url_of_an_http_server(alice_client: Any, team_a: Any) -> None:
    response = alice_client.post("/mcp/register/", {"team": team_a.pk, "name": "kv", "transport": "http"})
    assert response.status_code == 400 and "An HTTP server needs its URL" in response.content.decode()


def test_a_registered_script_is_stored_as_its_argv_and_shown_inspecting(alice_client: Any, team_a: Any) -> None:
    with plugin_file("team-a/kv_server.py", "x = 1\n"):
        response = alice_client.post("/mcp/register/", {"team": team_a.pk, "name": "kv", "transport": "stdio",
                                                        "command": "kv_server.py --size '2 MB'"})
    server = MCPServer.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/mcp/{server.pk}/"
    assert server.command == ["kv_server.py", "--size", "2 MB"] and server.status == Status.PENDING
    page = alice_client.get(f"/mcp/{server.pk}/").content.decode()
    assert "Inspecting" in page and 'hx-trigger="every 1s"' in page


def test_the_command_field_starts_empty_not_null(alice_client: Any, team_a: Any) -> None:
    page = alice_client.get("/mcp/register/").content.decode()
    assert 'name="command"' in page and "null" not in page


def test_another_teams_server_is_not_listed_and_is_a_404_on_every_page(
        alice_client: Any, bob_client: Any, team_a: Any, team_b: Any) -> None:
    server = ready_server(team_a)
    assert "kv_server.py" in alice_client.get("/mcp/").content.decode()
    assert "kv_server.py" not in bob_client.get("/mcp/").content.decode()
    assert bob_client.get(f"/mcp/{server.pk}/").status_code == 404
    assert bob_client.post(f"/mcp/{server.pk}/try/", {"tool": "put", "arguments": "{}"}).status_code == 404
    assert bob_client.post(f"/mcp/{server.pk}/reinspect/").status_code == 404
    assert MCPServer.objects.get().status == Status.READY


def test_the_server_page_shows_each_tools_schema_and_the_jobs_that_use_it(
        alice_client: Any, alice: Any, team_a: Any) -> None:
    from webapp.jobs.models import TrainingJob

    server = ready_server(team_a)
    TrainingJob.objects.create(team=team_a, created_by=alice, name="kv agent",
                               config={"steps": 2, "mcp": {"kv": {"command": ["kv_server.py"], "tools": ["put"]}}})
    TrainingJob.objects.create(team=team_a, created_by=alice, name="no mcp", config={"steps": 2})
    page = alice_client.get(f"/mcp/{server.pk}/").content.decode()
    assert "&quot;required&quot;: [" in page and "Store a value." in page
    assert "kv agent" in page and "no mcp" not in page


def test_trying_with_arguments_that_are_not_a_json_object_says_so(alice_client: Any, team_a: Any) -> None:
    server = ready_server(team_a)
    response = alice_client.post(f"/mcp/{server.pk}/try/", {"tool": "put", "arguments": "[1]"},
                                 HTTP_HX_REQUEST="true")
    assert response.status_code == 400 and "arguments must be a JSON object" in response.content.decode()
