"""With AGENTFLY_RAY_ADDRESS set, a job's pools run on the operator's Ray cluster under its team's budget."""

from __future__ import annotations

from typing import Any

from trainer.config import load_config
from webapp.jobs.cluster import with_ray


def test_a_job_runs_its_pools_on_the_operators_cluster_under_its_own_teams_budget(settings: Any) -> None:
    settings.AGENTFLY_RAY_ADDRESS = "ray-head:6379"
    settings.AGENTFLY_RAY_TEAM_BUDGETS = {"*": {"sandbox": 64}, "vision": {"sandbox": 16}}
    # A user's config may not point at another job's pool or pick its own team or budget.
    config = {"resources": {"python": {"max": 4}, "job": "job-1", "team": "other", "team_budget": {"sandbox": 999}}}
    ran = load_config(base=with_ray(config, 7, "vision"))
    rb = ran.resource_backend
    assert (rb.backend, rb.address, rb.job, rb.team, rb.team_budget) == (
        "ray", "ray-head:6379", "job-7", "vision", {"sandbox": 16})
    assert list(ran.resources) == ["python"] and ran.resources["python"].max == 4
    # Every environment (sandboxes, simulators, MCP sessions, stores) goes to the nodes with sandbox room.
    assert rb.placement == {k: {"sandbox": 1.0} for k in ("sandbox", "environment", "mcp", "other")}
    # A pool the job's tool declares (the key chain's kv store) is enough to put the job on the cluster.
    assert load_config(base=with_ray({}, 8, "nlp", declared={"kv"})).resource_backend.team_budget == {"sandbox": 64}


def test_a_job_with_no_pool_stays_off_the_cluster_with_its_own_loopback_and_no_ray_token(
        settings: Any, monkeypatch: Any) -> None:
    from webapp.jobs.isolation import network_for, ray_env

    settings.AGENTFLY_RAY_ADDRESS = "ray://ray-head:10001"
    settings.AGENTFLY_JOB_NETWORK = "auto"
    monkeypatch.setenv("RAY_AUTH_TOKEN", "the-clusters-token")
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    # The calculator declares no resource; a rate-limited API's limiter runs in the job's own processes.
    for config in ({}, {"resources": {"search": {"api": {"rate": 2}}}}):
        ran = with_ray(config, 9, "nlp", declared=set())
        assert "resource_backend" not in ran
        assert ray_env(ran) == {}
    assert network_for({}) == "none"
    pooled = with_ray({}, 9, "nlp", declared={"python"})
    assert ray_env(pooled) == {"RAY_AUTH_TOKEN": "the-clusters-token"} and network_for(pooled) == "host"


def test_without_a_cluster_or_when_the_job_asks_for_local_pools_the_config_is_unchanged(settings: Any) -> None:
    settings.AGENTFLY_RAY_ADDRESS = ""
    assert with_ray({"resources": {}}, 7, "vision") == {"resources": {}}
    settings.AGENTFLY_RAY_ADDRESS = "auto"
    local = {"resources": {"backend": "local"}}
    assert with_ray(local, 7, "vision") == local
