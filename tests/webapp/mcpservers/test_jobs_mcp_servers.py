"""A team's registered MCP server is chosen for a job like any registered tool: the form and the API store it
as registered, only the team's own ready servers can be chosen, and the worker runs only what the rule allows
when the job starts. On a real worker, the key-chain warm start trains against the team's own key-value
server, each rollout's session seeded with its sample."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

import agentfly as af
from tests.webapp.helpers import ROOT, wait_for
from tests.webapp.registry.test_registry_security import plugin_file
from webapp.jobs.models import Status as JobStatus
from webapp.jobs.models import TrainingJob
from webapp.mcpservers.jobs import for_job
from webapp.mcpservers.models import MCPServer, MCPServerVersion, Status
from webapp.mcpservers.rules import NotAllowed

STORE = Path(af.__file__).parent / "resources" / "mcp_servers" / "kv_store.py"
WARM_START = ROOT / "examples" / "key_chain" / "warm_start"
LISTING = [{"name": n, "description": n, "input_schema": {"type": "object", "properties": {}}}
           for n in ("lookup", "put", "reset", "seed")]


def ready_server(team: Any, name: str = "kv", **fields: Any) -> MCPServer:
    server = MCPServer.objects.create(team=team, name=name, transport="stdio", command=["kv_server.py"],
                                      reset_tool="reset", seed_tool="seed", status=Status.READY, **fields)
    version = MCPServerVersion.objects.create(server=server, listing_hash=name, tools=LISTING)
    MCPServer.objects.filter(pk=server.pk).update(current_version=version)
    server.refresh_from_db()
    return server


def key_chain_job(builtins_or_entries: dict[str, Any], team: str, **fields: Any) -> dict[str, Any]:
    return {"name": "key chain over mcp", "team": team, "tools": [], "reward": builtins_or_entries["exact_match"].pk,
            "model_source": "path", "model_path": str(WARM_START), "task": "key_chain", "task_size": 8,
            "max_turns": 6, "max_new_tokens": 32, "steps": 1, "prompts_per_step": 2, "group_size": 2,
            "eval_size": 2, "save_every": 0, **fields}


@pytest.fixture
def entries(db: None) -> dict[str, Any]:
    from webapp.registry.models import Entry
    from webapp.registry.tasks import sync_builtins

    sync_builtins()
    return {e.name: e for e in Entry.objects.filter(team__isnull=True).ready()}


def test_a_job_stores_its_teams_server_as_registered_with_the_tools_chosen_for_the_model(
        alice_api: Any, team_a: Any, entries: dict[str, Any]) -> None:
    server = ready_server(team_a)
    response = alice_api.post("/api/jobs/", key_chain_job(entries, "team-a", mcp_tools=[f"{server.pk}/lookup"],
                                                          resources={"kv": {"max": 3}}), format="json")
    assert response.status_code == 201, response.content
    config = TrainingJob.objects.get(pk=response.json()["id"]).config
    assert config["mcp"] == {"kv": {"command": ["kv_server.py"], "tools": ["lookup"], "reset_tool": "reset",
                                    "seed_tool": "seed"}}
    assert config["resources"] == {"kv": {"max": 3}}  # the server's pool is sized like any other


def test_a_server_named_like_a_chosen_tools_resource_is_refused_naming_the_tool(
        alice_api: Any, team_a: Any, entries: dict[str, Any]) -> None:
    server = ready_server(team_a)  # "kv", the resource of the built-in lookup tool
    response = alice_api.post("/api/jobs/", key_chain_job(entries, "team-a", mcp_tools=[f"{server.pk}/put"],
                                                          tools=[entries["lookup"].pk]), format="json")
    assert response.status_code == 400
    assert "the resource a chosen tool or the reward uses (lookup)" in response.json()["mcp_tools"][0]["message"]


def test_another_teams_server_one_not_ready_or_a_hidden_or_unknown_tool_cannot_be_chosen(alice_api: Any, team_a: Any, team_b: Any,
                                                                entries: dict[str, Any]) -> None:
    theirs = ready_server(team_b, "theirs")
    pending = ready_server(team_a, "pending")
    MCPServer.objects.filter(pk=pending.pk).update(status=Status.PENDING)
    ours = ready_server(team_a, "ours")
    for tool in (f"{theirs.pk}/lookup", f"{pending.pk}/lookup", f"{ours.pk}/reset", f"{ours.pk}/teleport"):
        response = alice_api.post("/api/jobs/", key_chain_job(entries, "team-a", mcp_tools=[tool]), format="json")
        assert response.status_code == 400, response.content
        assert "is not a tool of a ready MCP server of your teams" in response.json()["mcp_tools"][0]["message"]
    assert not TrainingJob.objects.exists()


def test_the_launch_page_offers_the_tools_of_only_the_teams_ready_servers_less_reset_and_seed(
        alice_client: Any, team_a: Any, team_b: Any) -> None:
    ready_server(team_a, "ours")
    ready_server(team_b, "theirs")
    page = alice_client.get("/jobs/launch/").content.decode()
    assert "lookup (team-a/ours)" in page and "put (team-a/ours)" in page
    assert "reset (team-a/ours)" not in page and "theirs" not in page


def test_the_worker_runs_the_argv_the_rule_allows_and_refuses_a_server_not_registered(team_a: Any) -> None:
    ready_server(team_a)
    stored = {"mcp": {"kv": {"command": ["rm", "-rf", "/"], "tools": ["lookup"]}}}  # as written behind the API
    with plugin_file("team-a/kv_server.py", STORE.read_text()) as script:
        ran = for_job(stored, team_a)["mcp"]["kv"]
        assert ran["command"] == [sys.executable, str(script.resolve())]  # the registered script, not the row's
        assert ran["read_paths"] == [str(script.resolve().parent)]  # its team's folder, never its argv's paths
        assert (ran["tools"], ran["reset_tool"], ran["seed_tool"], ran["network"]) == (["lookup"], "reset", "seed",
                                                                                    "none")
    with pytest.raises(NotAllowed, match="plugin folder"):
        for_job(stored, team_a)  # the script is gone: checked again when the job starts
    with pytest.raises(NotAllowed, match="'other' is not a ready server of team team-a"):
        for_job({"mcp": {"other": {"command": ["x.py"]}}}, team_a)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_key_chain_warm_start_trains_against_the_teams_registered_kv_server(
        transactional_db: None, builtins: dict[str, Any], alice: Any, alice_api: Any) -> None:
    with plugin_file("team-a/kv_server.py", STORE.read_text()):
        registered = alice_api.post("/api/mcp-servers/", {"team": "team-a", "name": "kv", "transport": "stdio",
                                                          "command": ["kv_server.py"], "reset_tool": "reset",
                                                          "seed_tool": "seed"}, format="json")
        assert registered.status_code == 202, registered.content
        server = wait_for(lambda: MCPServer.objects.filter(pk=registered.json()["id"]).exclude(
            status=Status.PENDING).first(), 90, "the worker to list the server's tools")
        assert server.status == Status.READY, server.error
        launched = alice_api.post("/api/jobs/", key_chain_job(builtins, "team-a", mcp_tools=[f"{server.pk}/lookup"],
                                                              resources={"kv": {"max": 4}}), format="json")
        assert launched.status_code == 201, launched.content
        job = wait_for(lambda: TrainingJob.objects.filter(pk=launched.json()["id"], status__in=(
            JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)).first(), 420, "the job to finish", 1)
    assert job.status == JobStatus.SUCCEEDED, job.error
    events = alice_api.get(f"/api/jobs/{job.pk}/events/?types=resources,samples&limit=5000").json()["events"]
    pools = [e["data"]["pools"]["kv"] for e in events if e["type"] == "resources" and "kv" in e["data"]["pools"]]
    observations = [m["content"] for e in events if e["type"] == "samples" for t in e["data"]["trajectories"]
                    for m in t["messages"] if m["role"] == "tool"]
    assert any(o.startswith("next: ") for o in observations), observations[:5]
    assert pools and max(p["created"] for p in pools) >= 1
    assert settings.AGENTFLY_MCP_NETWORK == []  # and it ran with no network
