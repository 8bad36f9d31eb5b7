"""A team's rate-limited APIs in its jobs: one budget per team and API, within the operator's quota.

A job uses an API as a resource (``resources.<name>.api`` in its config: a ``SharedRateLimiter``, whose
budget lives in Redis; ``trainer.config.APIConfig``). The operator sets each team's limits per API
(``APIQuota``, in the admin). Then:

- at launch (``at_launch``, the form and the REST API): every resource the job uses that its team has a
  quota for is marked as an API; an API without a quota, a limit above the quota, or a ``key`` of the
  config's own is refused, naming the fix;
- at start (``for_job``, the worker): each API resource is rewritten to the team's budget
  (``team-<slug>:<api>``, the same for every job of the team, so all of them together keep to the quota)
  with the operator's limits, lowered where the config asks for less (a quota lowered since the launch
  wins); an API with no quota now fails the job;
- while it runs (``credential``): the training process gets a Redis URL of its team's own Redis user,
  whose rights are only the limiter's commands on the keys of its team's budgets, never the server's
  Redis URL. The worker creates the user (or refreshes its rights) and adds a random password for this
  run, which it removes when the run ends; docs/security.md says who may do what;
- and always (``cap_team_redis``, beat): Redis has no memory limit per user, and the limiter's commands
  (``SET``, ``HSET``, ``ZADD`` on the team's keys) can store anything, so every few seconds the memory of
  each team's keys is summed; a team past ``AGENTFLY_TEAM_REDIS_MAX_BYTES`` loses its keys' rights (at once,
  on its open connections too), its connections and its keys, and its jobs' API calls fail as the
  infrastructure's until its next job starts with an empty budget.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote, urlsplit

from django.conf import settings
from django.db import transaction
from django.urls import reverse

from webapp.accounts.models import Team
from webapp.jobs.models import APIQuota, Status, TrainingJob

log = logging.getLogger(__name__)
LIMITS = ("rate", "burst", "concurrency", "daily_quota")
# The variable the training process's SharedRateLimiter reads its Redis URL from (never the config, which
# is written into the job's folder).
URL_VARIABLE = "AGENTFLY_RATELIMIT_REDIS"


class APIRefused(ValueError):
    """A job's use of an API that its team's quotas do not allow; the message names the fix."""


def budget_key(team_slug: str, api: str) -> str:
    """The limiter key every job of the team shares for ``api``."""
    return f"{settings.REDIS_PREFIX}team-{team_slug}:{api}"


def redis_username(team_slug: str) -> str:
    return f"{settings.REDIS_PREFIX}agentfly-team-{team_slug}"


def key_pattern(team_slug: str) -> str:
    """The Redis keys of every budget of the team (a glob: the prefix's own glob characters escaped)."""
    from agentfly.resources.ratelimit import KEY_PREFIX

    return re.sub(r"([*?\[\]\\])", r"\\\1", KEY_PREFIX + budget_key(team_slug, "")) + "*"


def quota_page() -> str:
    return reverse("admin:jobs_apiquota_changelist")


def quotas_of_team(team: Team) -> dict[str, APIQuota]:
    return {q.api: q for q in APIQuota.objects.filter(team=team)}


def api_names(resources: dict[str, Any], used: Iterable[str], quotas: dict[str, APIQuota]) -> list[str]:
    """The APIs among a job's resources: those its config marks (``api``), and those it uses (a pool size,
    a chosen tool's resource) that its team has a quota for."""
    marked = [n for n, entry in resources.items() if isinstance(entry, dict) and "api" in entry]
    return sorted({*marked, *(n for n in [*resources, *used] if n in quotas)})


def missing_quota(team: Team, api: str) -> str:
    return (f"resource {api!r} is a rate-limited API, and team {team.slug!r} has no quota for it: an operator "
            f"adds one in the admin ({quota_page()}: team {team.slug}, API {api}); until then no job of the "
            "team may use it")


def refusals(api: str, asked: Any, quota: APIQuota) -> list[str]:
    """What is wrong with a config's ``api`` block for ``api`` under ``quota`` (nothing: an empty list)."""
    if asked is None:
        return []
    if not isinstance(asked, dict):
        return [f"resources.{api}.api must be an object of limits ({', '.join(LIMITS)}), or {{}} for the quota's"]
    wrong = []
    unknown = sorted(set(asked) - set(LIMITS))
    if unknown:
        wrong.append(f"resources.{api}.api: {', '.join(unknown)} cannot be set by a job (the worker gives every job "
                     f"of the team the team's budget); set only {', '.join(LIMITS)}, each at most the quota")
    for name in LIMITS:
        value, most = asked.get(name), getattr(quota, name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            wrong.append(f"resources.{api}.api.{name} must be a number, got {value!r}")
        elif name == "daily_quota" and most and value == 0:
            wrong.append(f"resources.{api}.api.daily_quota=0 means no daily limit, above the team's quota of {most} "
                         "calls a day; leave it out to use the quota")
        elif value > most and not (name == "daily_quota" and most == 0):
            unit = " per second" if name == "rate" else " calls a day" if name == "daily_quota" else ""
            wrong.append(f"resources.{api}.api.{name}={value:g} is above team {quota.team.slug!r}'s quota of "
                         f"{most:g}{unit}; leave it out to use the quota, or ask an operator to raise it "
                         f"({quota_page()})")
    return wrong


def at_launch(resources: dict[str, Any], used: Iterable[str], team: Team) -> dict[str, Any]:
    """``resources`` as the job is stored: each API it uses marked (``api``, its own lower limits kept).
    Raises ``APIRefused`` with every reason when one is not allowed."""
    quotas = quotas_of_team(team)
    out = dict(resources)
    wrong: list[str] = []
    for api in api_names(resources, used, quotas):
        entry = dict(out.get(api) or {})
        quota = quotas.get(api)
        if quota is None:
            wrong.append(missing_quota(team, api))
            continue
        wrong += refusals(api, entry.get("api"), quota)
        entry["api"] = entry.get("api") or {}
        out[api] = entry
    if wrong:
        raise APIRefused("; ".join(wrong) + ".")
    return out


def limits(asked: dict[str, Any], quota: APIQuota) -> dict[str, Any]:
    """The operator's limits, each lowered where ``asked`` is lower: never above the quota."""
    out: dict[str, Any] = {}
    for name in LIMITS:
        most, value = getattr(quota, name), asked.get(name)
        usable = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
        if name == "daily_quota":
            out[name] = int(min(value, most) if usable and most else value if usable else most)  # type: ignore[arg-type]  # a quota's limit is set
        else:
            out[name] = min(value, most) if usable else most
    out["rate"] = float(out["rate"])
    out["burst"], out["concurrency"] = int(out["burst"]), int(out["concurrency"])
    return out


def for_job(config: dict[str, Any], team: Team) -> dict[str, Any]:
    """``config`` with each API resource on its team's budget, within the quota as it is now. Raises
    ``APIRefused`` for an API the team has no quota for (a quota removed since the launch, a config written
    behind the API)."""
    resources = config.get("resources") or {}
    if not isinstance(resources, dict):
        return config
    quotas = quotas_of_team(team)
    names = api_names(resources, (), quotas)
    if not names:
        return config
    out = dict(resources)
    for api in names:
        quota = quotas.get(api)
        if quota is None:
            raise APIRefused(missing_quota(team, api))
        entry = dict(out.get(api) or {})
        asked = entry.get("api") if isinstance(entry.get("api"), dict) else {}
        # Whatever the config says, the key is the team's (never another team's budget) and the limits are
        # at most the operator's; a plugin's own spec would carry its own key and limits, so it goes too.
        entry.pop("spec", None)
        entry["api"] = {"key": budget_key(team.slug, api), **limits(asked, quota)}  # type: ignore[arg-type]  # a dict, above
        out[api] = entry
    return {**config, "resources": out}


def uses_api(config: dict[str, Any]) -> bool:
    """Whether the config (as the worker runs it) has an API resource: it then needs the host's network."""
    resources = config.get("resources") or {}
    return isinstance(resources, dict) and any(isinstance(e, dict) and "api" in e for e in resources.values())


def server_redis() -> Any:
    import redis

    return redis.Redis.from_url(settings.REDIS_URL)


def job_url(username: str, password: str) -> str:
    """The server's Redis address with the team user's credential instead of the server's."""
    parts = urlsplit(settings.REDIS_URL)
    host = parts.hostname or "127.0.0.1"
    netloc = f"{quote(username, safe='')}:{quote(password, safe='')}@{host}:{parts.port or 6379}"
    return f"{parts.scheme}://{netloc}{parts.path or '/0'}"


def grant(team: Team, job_pk: int, *, first: bool) -> tuple[str, str]:
    """Create the team's Redis user (or refresh its rights) with one more password, for this run; returns
    ``(username, password)``. The leader of a job (``first``) that finds no other running job of its team
    also drops the passwords left by runs whose worker died before it could remove them: under the team's
    row lock, so no other job's start adds one in between."""
    import redis

    from agentfly.resources.ratelimit import REDIS_COMMANDS, SCRIPTS

    username, password = redis_username(team.slug), secrets.token_urlsafe(32)
    r = server_redis()
    try:
        for script in SCRIPTS:  # the user may run these, but not load them
            r.script_load(script)
        with transaction.atomic():
            Team.objects.select_for_update().filter(pk=team.pk).first()
            alone = first and not TrainingJob.objects.filter(team=team, status=Status.RUNNING).exclude(pk=job_pk).exists()
            r.execute_command("ACL", "SETUSER", username, *(["reset"] if alone else []), "on", f">{password}",
                              "resetkeys", f"~{key_pattern(team.slug)}", "resetchannels", "-@all",
                              *(f"+{c}" for c in REDIS_COMMANDS))
    except redis.ResponseError as exc:
        raise APIRefused(f"the worker could not give team {team.slug!r} its Redis user for the job's APIs ({exc}); "
                         "the operator lets the worker's Redis user (REDIS_URL) run ACL SETUSER and SCRIPT LOAD, "
                         "on Redis 6 or later") from None
    finally:
        r.close()
    return username, password


def team_redis_bytes(r: Any, team_slug: str, most: int) -> int:
    """The memory of the team's keys (their values and Redis's own overhead, as ``MEMORY USAGE`` counts), or
    the first sum past ``most``: the count stops there, so a team with millions of keys costs one check."""
    total = 0
    for key in r.scan_iter(match=key_pattern(team_slug), count=500):
        total += int(r.memory_usage(key, samples=0) or 0)
        if total > most:
            break
    return total


def cap_team_redis() -> list[str]:
    """Cut off every team whose Redis keys use more than ``AGENTFLY_TEAM_REDIS_MAX_BYTES``: their user loses
    its key rights (checked on every command, so its open connections stop writing at once), its connections
    are closed and its keys deleted. Returns the teams cut off. ``grant`` gives the rights back at the team's
    next job start (with an empty budget)."""
    most = int(settings.AGENTFLY_TEAM_REDIS_MAX_BYTES)
    prefix = redis_username("")
    r = server_redis()
    cut: list[str] = []
    try:
        users = [u.decode() if isinstance(u, bytes) else str(u) for u in r.execute_command("ACL", "USERS")]
        for username in users:
            if not username.startswith(prefix):
                continue
            slug = username[len(prefix):]
            used = team_redis_bytes(r, slug, most)
            if used <= most:
                continue
            r.execute_command("ACL", "SETUSER", username, "resetkeys")
            r.execute_command("CLIENT", "KILL", "USER", username)
            for key in r.scan_iter(match=key_pattern(slug), count=500):
                r.delete(key)
            log.warning("team %s's Redis keys used more than %d bytes (AGENTFLY_TEAM_REDIS_MAX_BYTES): its Redis "
                        "user lost its keys, connections and rights until its next job starts", slug, most)
            cut.append(slug)
    finally:
        r.close()
    return cut


def revoke(username: str, password: str) -> None:
    """Remove this run's password: the URL the run had no longer signs in (its open connections end with it)."""
    r = server_redis()
    try:
        r.execute_command("ACL", "SETUSER", username, f"<{password}")
    finally:
        r.close()


@contextmanager
def credential(job: TrainingJob, config: dict[str, Any], *, first: bool = True) -> Iterator[dict[str, str]]:
    """The training process's environment for the job's APIs: its team's Redis URL for this run ({} for a
    job without APIs). The run's password is removed when the block ends, however it ends."""
    if not uses_api(config):
        yield {}
        return
    username, password = grant(job.team, job.pk, first=first)
    try:
        yield {URL_VARIABLE: job_url(username, password)}
    finally:
        revoke(username, password)
