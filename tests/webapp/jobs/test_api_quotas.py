"""Per-team API quotas: the operator's limits on each rate-limited API, the refusals at launch (the form and
the REST API) and at start (the worker), the rewrite that puts every job of a team on one budget, and the
team's Redis user, tried against the real Redis in each way around it (docs/security.md)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from django.conf import settings
from django.urls import reverse

from agentfly.resources.ratelimit import KEY_PREFIX, SCRIPTS
from tests.webapp.factories import builtin_entries, launch_data
from webapp.jobs import apis
from webapp.jobs.models import APIQuota, Status, TrainingJob
from webapp.jobs.tasks import config_to_run


@pytest.fixture
def entries(db: None) -> tuple[Any, Any]:
    return builtin_entries()



def api_launch(api: Any, entries: tuple[Any, Any], team: str = "team-a", **fields: Any) -> Any:
    tool, reward = entries
    return api.post("/api/jobs/", {"name": "api job", "team": team, "tools": [tool.pk], "reward": reward.pk,
                                   "queue": "gpu", "steps": 3, **fields}, format="json")


def quota(team: Any, api: str = "search", **limits: Any) -> APIQuota:
    return APIQuota.objects.create(team=team, api=api, **{"rate": 5, "burst": 2, "concurrency": 3,
                                                          "daily_quota": 1000, **limits})


# ------------------------------------------------------------------------------------------- at launch
def test_an_api_without_a_quota_for_the_team_is_refused_at_launch_naming_the_admin_page(
        alice_api: Any, alice_client: Any, team_a: Any, team_b: Any, entries: tuple[Any, Any]) -> None:
    quota(team_b)  # another team's quota is not this team's
    refused = api_launch(alice_api, entries, resources={"search": {"api": {}}})
    assert refused.status_code == 400
    message = refused.json()["resources"][0]["message"]
    assert "team 'team-a' has no quota for it" in message and "/admin/jobs/apiquota/" in message
    page = alice_client.post(reverse("jobs:launch"), launch_data(team_a, *entries,
                                                                 resources='{"search": {"api": {}}}'))
    assert page.status_code == 400 and "has no quota for it" in page.content.decode()
    assert not TrainingJob.objects.exists()


def test_a_limit_above_the_teams_quota_is_refused_at_launch_and_a_lower_one_is_kept(
        alice_api: Any, alice_client: Any, team_a: Any, entries: tuple[Any, Any]) -> None:
    quota(team_a, rate=5, daily_quota=1000)
    for asked, said in [({"rate": 50}, "rate=50 is above team 'team-a''s quota of 5 per second"),
                        ({"concurrency": 4}, "concurrency=4 is above"),
                        ({"daily_quota": 0}, "daily_quota=0 means no daily limit"),
                        ({"key": "team-b:search"}, "key cannot be set by a job")]:
        refused = api_launch(alice_api, entries, resources={"search": {"api": asked}})
        assert refused.status_code == 400 and said in refused.json()["resources"][0]["message"], asked
    page = alice_client.post(reverse("jobs:launch"), launch_data(
        team_a, *entries, resources='{"search": {"api": {"rate": 50}}}'))
    assert page.status_code == 400 and "above team" in page.content.decode()
    launched = api_launch(alice_api, entries, resources={"search": {"max": 1, "api": {"rate": 2}}})
    assert launched.status_code == 201, launched.json()
    assert TrainingJob.objects.get().config["resources"] == {"search": {"max": 1, "api": {"rate": 2}}}


def test_a_chosen_tools_resource_that_the_team_has_a_quota_for_is_stored_as_an_api(
        alice_api: Any, team_a: Any, entries: tuple[Any, Any]) -> None:
    quota(team_a, api="search")
    searcher = entries[0]
    searcher.current_version.resource = "search"  # as the worker records a tool with @tool(resource="search")
    searcher.current_version.save()
    launched = api_launch(alice_api, entries)
    assert launched.status_code == 201, launched.json()
    assert TrainingJob.objects.get().config["resources"] == {"search": {"api": {}}}


# ------------------------------------------------------------------------------------------- at start
def stored_job(team: Any, resources: dict[str, Any]) -> TrainingJob:
    """A job row as a config written behind the API would leave it (the form never saw it)."""
    return TrainingJob.objects.create(team=team, name="behind the API", queue="gpu", config={"resources": resources})


def test_the_worker_puts_every_job_of_a_team_on_its_teams_budget_within_the_quota(
        team_a: Any, team_b: Any) -> None:
    quota(team_a, rate=5, burst=2, concurrency=3, daily_quota=1000)
    asked = {"key": "team-b:search", "rate": 100, "burst": 1, "daily_quota": 0, "redis_url": "redis://elsewhere"}
    job = stored_job(team_a, {"search": {"api": asked, "spec": "mymodule:MY_OWN_LIMITER", "max": 1}})
    ran = config_to_run(job)["resources"]["search"]
    prefix = settings.REDIS_PREFIX
    # The team's key, never the one written; the quota's limits, lowered only where the config asked for less.
    assert ran == {"max": 1, "api": {"key": f"{prefix}team-team-a:search", "rate": 5.0, "burst": 1, "concurrency": 3,
                                     "daily_quota": 1000}}
    other = stored_job(team_a, {"search": {"api": {}}})
    assert config_to_run(other)["resources"]["search"]["api"]["key"] == ran["api"]["key"]  # one budget per team


def test_a_job_whose_api_quota_was_removed_since_its_launch_fails_at_start_naming_the_fix(
        team_a: Any) -> None:
    job = stored_job(team_a, {"search": {"api": {}}})
    with pytest.raises(apis.APIRefused, match=r"team 'team-a' has no quota for it: an operator adds one in the "
                                              r"admin \(/admin/jobs/apiquota/"):
        config_to_run(job)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_job_started_by_the_worker_without_a_quota_fails_with_the_reason(
        transactional_db: None, team_a: Any, runs_dir: Any) -> None:
    from webapp.jobs.tasks import run_job

    tool, reward = builtin_entries()
    job = TrainingJob.objects.create(team=team_a, name="no quota", queue="gpu", config={
        "steps": 1, "rollout": {"tools": [tool.import_path], "reward": reward.import_path},
        "resources": {"search": {"api": {}}}})
    assert run_job(job.pk) == Status.FAILED
    job.refresh_from_db()
    assert "APIRefused" in job.error and "has no quota for it" in job.error and "/admin/jobs/apiquota/" in job.error


# ------------------------------------------------------------------------------------------- who sees it
def test_a_team_member_sees_the_teams_api_quotas_read_only_on_the_team_page_escaped(
        alice_client: Any, bob_api: Any, team_a: Any, team_b: Any) -> None:
    quota(team_a, api="search", rate=2.5, daily_quota=0)
    quota(team_b, api="bobs-api")
    page = alice_client.get(reverse("accounts:team", args=[team_a.slug])).content.decode()
    assert "<code>search</code>" in page and "2.5/s" in page and "no limit" in page
    assert "bobs-api" not in page  # another team's quotas are theirs
    assert "<form" not in page.split('id="api-quotas"')[1].split("</div>")[0]  # read-only
    bad = APIQuota(team=team_a, api="<script>x</script>", rate=1)
    with pytest.raises(Exception, match="A resource name"):
        bad.full_clean()  # the admin refuses a name that is no resource name
    bad.save()  # a row written past the admin is still shown as text
    page = alice_client.get(reverse("accounts:team", args=[team_a.slug])).content.decode()
    assert "<code>&lt;script&gt;x&lt;/script&gt;</code>" in page and "<script>x" not in page
    for taken in ("python", "backend"):  # a built-in resource, a setting of resources
        with pytest.raises(Exception, match="built-in resource or a setting of resources"):
            APIQuota(team=team_a, api=taken, rate=1).full_clean()


def test_the_rest_api_lists_the_callers_teams_api_quotas_and_changes_none(
        alice_api: Any, team_a: Any, team_b: Any) -> None:
    quota(team_a, api="search", rate=2.5)
    quota(team_b, api="bobs-api")
    listed = alice_api.get("/api/api-quotas/").json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert [(r["team"], r["api"], r["rate"], r["burst"], r["concurrency"], r["daily_quota"]) for r in rows] == [
        ("team-a", "search", 2.5, 2, 3, 1000)]
    assert alice_api.post("/api/api-quotas/", {"team": "team-a", "api": "more", "rate": 99},
                          format="json").status_code == 405
    assert APIQuota.objects.count() == 2


def test_only_a_superuser_changes_api_quotas_a_teams_staff_sees_only_its_own(
        alice: Any, bob: Any, team_a: Any, team_b: Any, client: Any) -> None:
    from django.contrib.auth import get_user_model

    own, other = quota(team_a), quota(team_b, api="bobs-api")
    alice.is_staff = True
    alice.save()
    client.force_login(alice)  # staff, and the admin of team A
    listing = client.get("/admin/jobs/apiquota/")
    assert listing.status_code == 200
    assert "search" in listing.content.decode() and "bobs-api" not in listing.content.decode()
    assert client.get(f"/admin/jobs/apiquota/{other.pk}/change/").status_code in (302, 404)
    assert client.post(f"/admin/jobs/apiquota/{own.pk}/change/", {"team": team_a.pk, "api": "search", "rate": 500,
                                                                 "burst": 500, "concurrency": 50,
                                                                 "daily_quota": 0}).status_code == 403
    assert client.post("/admin/jobs/apiquota/add/", {"team": team_a.pk, "api": "more", "rate": 500, "burst": 1,
                                                    "concurrency": 1, "daily_quota": 0}).status_code == 403
    own.refresh_from_db()
    assert own.rate == 5 and APIQuota.objects.count() == 2
    root = get_user_model().objects.create_superuser("root", password="x")
    client.force_login(root)
    changed = client.post(f"/admin/jobs/apiquota/{own.pk}/change/", {"team": team_a.pk, "api": "search", "rate": 8,
                                                                     "burst": 3, "concurrency": 2, "daily_quota": 0})
    assert changed.status_code == 302
    own.refresh_from_db()
    assert own.rate == 8 and own.daily_quota == 0


# ------------------------------------------------------------------------------------------- the Redis user
def team_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


def test_a_teams_redis_user_reaches_its_own_budgets_and_nothing_else(
        team_a: Any, team_b: Any, server_redis: redis.Redis) -> None:
    user, password = apis.grant(team_a, 0, first=True)
    r = team_client(apis.job_url(user, password))
    own = f"{KEY_PREFIX}{apis.budget_key('team-a', 'search')}:bucket"
    theirs = f"{KEY_PREFIX}{apis.budget_key('team-b', 'search')}:bucket"
    server_redis.hset(theirs, "tokens", 7)
    prefix = settings.REDIS_PREFIX
    assert r.ping()
    r.hset(own, "tokens", 1)
    assert r.hgetall(own) == {b"tokens": b"1"}
    # Another team's budget, the Celery queue and results, the channel layer's groups, an unprefixed key.
    for key in (theirs, f"{prefix}celery", f"{prefix}_kombu.binding.celery", f"{prefix}celery-task-meta-1",
                f"{prefix}asgi:group:job-1", f"{KEY_PREFIX}team-team-a:search:bucket", "anything"):
        with pytest.raises(redis.exceptions.NoPermissionError):
            r.get(key)
        with pytest.raises(redis.exceptions.NoPermissionError):
            r.set(key, "x")
    assert server_redis.hget(theirs, "tokens") == b"7"
    # No command beyond the limiter's: no Lua of its own (an endless loop would stall the server), no
    # listing, no flushing, no settings, no other users, no channels.
    for command in (("EVAL", "return 1", 0), ("SCRIPT", "LOAD", "return 1"), ("SCRIPT", "FLUSH"), ("KEYS", "*"),
                    ("SCAN", 0), ("FLUSHALL",), ("FLUSHDB",), ("CONFIG", "GET", "*"), ("ACL", "LIST"),
                    ("PUBLISH", f"{prefix}asgi", "x"), ("CLIENT", "LIST"), ("SHUTDOWN",)):
        with pytest.raises(redis.exceptions.NoPermissionError):
            r.execute_command(*command)
    # The limiter's own script, which the worker loaded, runs on the team's keys and on no other team's.
    take = server_redis.script_load(SCRIPTS[0])
    ours = [f"{KEY_PREFIX}{apis.budget_key('team-a', 'search')}:{k}" for k in ("bucket", "quota:d", "inflight", "breaker")]
    assert r.evalsha(take, 4, *ours, 5, 2, 0, "lease", 3, 1000)[0] in (0, -2)
    with pytest.raises(redis.exceptions.NoPermissionError):
        r.evalsha(take, 4, theirs, *ours[1:], 5, 2, 0, "lease", 3, 1000)
    r.close()


def test_each_run_has_its_own_password_removed_when_it_ends(team_a: Any, server_redis: redis.Redis) -> None:
    running = stored_job(team_a, {"search": {"api": {}}})
    first = apis.grant(team_a, running.pk, first=True)
    TrainingJob.objects.filter(pk=running.pk).update(status=Status.RUNNING)
    starting = stored_job(team_a, {"search": {"api": {}}})
    second = apis.grant(team_a, starting.pk, first=True)  # another job of the team starts while one runs
    assert team_client(apis.job_url(*first)).ping() and team_client(apis.job_url(*second)).ping()
    apis.revoke(*first)
    with pytest.raises(redis.exceptions.AuthenticationError):
        team_client(apis.job_url(*first)).ping()
    assert team_client(apis.job_url(*second)).ping()  # the other run goes on
    with pytest.raises(redis.exceptions.AuthenticationError):
        team_client(apis.job_url(apis.redis_username("team-b"), second[1])).ping()  # no other team's user
    # A run whose worker died never removed its password: the next job that starts while none of the
    # team's runs, drops it.
    TrainingJob.objects.filter(pk=running.pk).update(status=Status.FAILED)
    third = apis.grant(team_a, starting.pk, first=True)
    with pytest.raises(redis.exceptions.AuthenticationError):
        team_client(apis.job_url(*second)).ping()
    assert team_client(apis.job_url(*third)).ping()


def test_a_jobs_config_and_its_folder_never_hold_the_redis_credential(team_a: Any, server_redis: redis.Redis) -> None:
    quota(team_a)
    job = stored_job(team_a, {"search": {"api": {}}})
    config = config_to_run(job)
    with apis.credential(job, config) as env:
        url = env[apis.URL_VARIABLE]
        assert team_client(url).ping()
        assert settings.REDIS_URL not in url and url.split("@")[0].split(":")[-1] not in json.dumps(config)
    with pytest.raises(redis.exceptions.AuthenticationError):
        team_client(url).ping()  # the run ended: its password is gone
    with apis.credential(stored_job(team_a, {"python": {"max": 2}}), {"resources": {"python": {"max": 2}}}) as env:
        assert env == {}  # a job without an API gets no credential at all


def test_a_job_with_an_api_runs_on_the_hosts_network_holding_only_its_teams_redis_user(
        team_a: Any, runs_dir: Any, server_redis: redis.Redis, settings: Any) -> None:
    from webapp.jobs import isolation

    quota(team_a)
    job = stored_job(team_a, {"search": {"api": {}}})
    config = config_to_run(job)
    for folder in ("job", "plain"):  # the job folders the worker makes before it plans a sandbox
        (runs_dir / folder).mkdir(exist_ok=True)
    with apis.credential(job, config) as env:
        sandbox = isolation.sandbox_for(job, runs_dir / "job", config, env)
        seen = isolation.job_env(sandbox)
    assert sandbox.network == "host"  # the provider and Redis are beyond its own loopback
    assert seen[apis.URL_VARIABLE] == env[apis.URL_VARIABLE]
    assert settings.REDIS_URL not in seen.values() and "REDIS_URL" not in seen
    plain = stored_job(team_a, {"python": {"max": 2}})
    assert isolation.sandbox_for(plain, runs_dir / "plain", config_to_run(plain)).network == "none"
    settings.AGENTFLY_JOB_NETWORK = "none"
    with pytest.raises(isolation.SandboxUnavailable, match="AGENTFLY_JOB_NETWORK=none; the operator sets it to auto"):
        isolation.network_for(config)


def test_a_worker_whose_redis_user_may_not_create_users_fails_the_job_naming_what_to_allow(
        team_a: Any, server_redis: redis.Redis, settings: Any) -> None:
    name = f"{settings.REDIS_PREFIX}worker-without-acl"
    server_redis.execute_command("ACL", "SETUSER", name, "on", ">pw", "~*", "+@all", "-acl")
    try:
        settings.REDIS_URL = apis.job_url(name, "pw")  # the server's address, signed in as that user
        with pytest.raises(apis.APIRefused, match="lets the worker's Redis user \\(REDIS_URL\\) run ACL SETUSER"):
            apis.grant(team_a, 0, first=True)
    finally:
        server_redis.execute_command("ACL", "DELUSER", name)


def test_a_team_whose_redis_keys_outgrow_its_cap_is_cut_off_and_another_team_is_not(
        team_a: Any, team_b: Any, server_redis: redis.Redis, settings: Any) -> None:
    settings.AGENTFLY_TEAM_REDIS_MAX_BYTES = 64 * 1024
    a_user, a_password = apis.grant(team_a, 0, first=True)
    b_user, b_password = apis.grant(team_b, 0, first=True)
    a, b = team_client(apis.job_url(a_user, a_password)), team_client(apis.job_url(b_user, b_password))
    own = f"{KEY_PREFIX}{apis.budget_key('team-a', 'search')}"
    for i in range(4):  # the limiter's own commands, storing what no budget needs: 4 x 32 KiB
        a.set(f"{own}:hoard-{i}", "x" * 32 * 1024)
    b.hset(f"{KEY_PREFIX}{apis.budget_key('team-b', 'search')}:bucket", "tokens", 1)
    assert apis.cap_team_redis() == ["team-a"]  # what beat runs every 5 s
    assert list(server_redis.scan_iter(match=apis.key_pattern("team-a"))) == []
    with pytest.raises((redis.exceptions.ConnectionError, redis.exceptions.NoPermissionError)):
        a.set(f"{own}:hoard-5", "x")  # its connection was closed, and a new one may write nothing
    with pytest.raises(redis.exceptions.NoPermissionError):
        team_client(apis.job_url(a_user, a_password)).set(f"{own}:hoard-5", "x")
    assert b.hgetall(f"{KEY_PREFIX}{apis.budget_key('team-b', 'search')}:bucket") == {b"tokens": b"1"}
    # The team's next job start gives the rights back, with an empty budget.
    a_user, a_password = apis.grant(team_a, 0, first=True)
    assert team_client(apis.job_url(a_user, a_password)).hset(f"{own}:bucket", "tokens", 1) == 1
