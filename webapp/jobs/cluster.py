"""A job's environments on the Ray cluster the operator names (``AGENTFLY_RAY_ADDRESS``).

When it is set, every job that has resource pools (``has_pools``) gets ``resource_backend`` (``resources.backend=ray``): its pools run on
the cluster, one pool per resource for the whole job (id ``job-<pk>``, so a resumed job finds its leases),
its sandboxes on the nodes with ``sandbox`` room (``AGENTFLY_RAY_PLACEMENT``), drawing on its team's budget (``AGENTFLY_RAY_TEAM_BUDGETS``, JSON by team slug, ``"*"`` for every other team:
``{"*": {"sandbox": 64}, "vision": {"sandbox": 16, "scienceworld": 4}}``). When the job ends, fails or is
cancelled, or the sweep finds its worker dead, ``stop_ray_job`` stops its coordinator and with it every
instance the job had on the cluster (the coordinator also stops itself once no process of the job is alive).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from django.conf import settings

log = logging.getLogger(__name__)


def ray_job_id(job_pk: int) -> str:
    return f"job-{job_pk}"


def team_budget(slug: str) -> dict[str, int]:
    """The operator's budget for team ``slug`` ({} = none)."""
    budgets: dict[str, dict[str, int]] = settings.AGENTFLY_RAY_TEAM_BUDGETS
    return dict(budgets.get(slug, budgets.get("*", {})))


def has_pools(config: dict[str, Any], declared: Iterable[str]) -> bool:
    """Whether a job builds any resource pool: one its tools or reward declare (``declared``, as the registry
    recorded them), one its config names (``resources.<name>``; a rate-limited API's limiter stays in the job's
    own processes), or an MCP server's. A job with none stays off the cluster: no Ray token, no host network."""
    from trainer.config import RESOURCE_BACKEND_KEYS

    named = {name for name, entry in (config.get("resources") or {}).items()
             if name not in RESOURCE_BACKEND_KEYS and not (isinstance(entry, dict) and "api" in entry)}
    return bool(named or config.get("mcp") or {name for name in declared if name})


def with_ray(config: dict[str, Any], job_pk: int, team_slug: str, declared: Iterable[str] = ()) -> dict[str, Any]:
    """``config`` with its pools on the operator's Ray cluster, or unchanged when there is none or the job has
    no pool (``has_pools``; ``declared``: the resources its tools and reward declare)."""
    address = settings.AGENTFLY_RAY_ADDRESS
    if not address or not has_pools(config, declared):
        return config
    backend = dict(config.get("resource_backend") or {})
    resources = dict(config.get("resources") or {})
    if backend.get("backend", resources.get("backend")) == "local":
        return config  # the job asked for local pools
    for key in ("backend", "address", "job", "team", "team_budget"):
        resources.pop(key, None)  # a user may not name another job's pool or another team's budget
    backend.update(backend="ray", address=address, job=ray_job_id(job_pk), team=team_slug,
                   team_budget=team_budget(team_slug))
    backend.setdefault("placement", dict(settings.AGENTFLY_RAY_PLACEMENT))
    return {**config, "resources": resources, "resource_backend": backend}


def stop_ray_job(job_pk: int) -> None:
    """Stop the job's coordinator and its instances on the cluster; quiet when there is nothing to stop."""
    if not settings.AGENTFLY_RAY_ADDRESS:
        return
    from agentfly.resources import ResourceError

    try:
        from agentfly.resources.backends.ray import stop_job

        stop_job(ray_job_id(job_pk), settings.AGENTFLY_RAY_ADDRESS)
    except ResourceError as exc:  # the cluster is down: its coordinator stops itself once no process of the job lives
        log.warning("job %d's pools on the Ray cluster were not stopped: %s", job_pk, exc)
    except Exception:
        log.exception("could not stop job %d's pools on the Ray cluster", job_pk)

