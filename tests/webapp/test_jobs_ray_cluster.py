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
    assert load_config(base=with_ray({}, 8, "nlp")).resource_backend.team_budget == {"sandbox": 64}


def test_without_a_cluster_or_when_the_job_asks_for_local_pools_the_config_is_unchanged(settings: Any) -> None:
    settings.AGENTFLY_RAY_ADDRESS = ""
    assert with_ray({"resources": {}}, 7, "vision") == {"resources": {}}
    settings.AGENTFLY_RAY_ADDRESS = "auto"
    local = {"resources": {"backend": "local"}}
    assert with_ray(local, 7, "vision") == local
