"""All of a team's jobs together stay within the operator's quota for an API, measured at a real HTTP
server on loopback that records when each request arrived; another team has a budget of its own.

Each job is launched through the REST API, rewritten by the worker's own ``config_to_run``, and given its
team's Redis user by ``apis.credential``; its process builds the API resource from that config with the
trainer's ``build_resources`` and holds no other Redis credential."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import redis

from agentfly.resources.ratelimit import KEY_PREFIX
from tests.provider_api import ProviderAPI, most_in_one_second, serving
from tests.webapp.factories import builtin_entries
from webapp.jobs import apis, worker
from webapp.jobs.models import APIQuota, TrainingJob
from webapp.jobs.tasks import config_to_run

ROOT = Path(__file__).resolve().parents[3]
CLIENT = Path(__file__).with_name("api_budget_client.py")
RATE, BURST = 4, 2  # the operator's quota for each team
# The provider's limit, requests in any one second: the operator keeps each team's quota (at most RATE + BURST
# in a second, when the limiter takes its tokens) below it, for the jitter between taking a token and the
# request's arrival (a process's first requests open their connections; later ones arrive sooner).
PROVIDER = 8


@pytest.fixture
def api_server() -> Iterator[ProviderAPI]:
    with serving() as server:  # answers 200 to everything, by path: one path per team
        yield server


def launch(api: Any, team: str, entries: tuple[Any, Any]) -> TrainingJob:
    tool, reward = entries
    response = api.post("/api/jobs/", {"name": "searching", "team": team, "tools": [tool.pk], "reward": reward.pk,
                                       "queue": "gpu", "steps": 3, "resources": {"search": {"api": {}}}},
                        format="json")
    assert response.status_code == 201, response.json()
    return TrainingJob.objects.get(pk=response.json()["id"])



@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_jobs_of_a_team_never_exceed_its_quota_together_while_another_team_has_its_own(
        alice_api: Any, bob_api: Any, team_a: Any, team_b: Any, api_server: ProviderAPI,
        server_redis: redis.Redis, tmp_path: Path) -> None:
    entries = builtin_entries()
    for team in (team_a, team_b):
        APIQuota.objects.create(team=team, api="search", rate=RATE, burst=BURST, concurrency=3)
    jobs = [(launch(alice_api, "team-a", entries), "/a"), (launch(alice_api, "team-a", entries), "/a"),
            (launch(bob_api, "team-b", entries), "/b")]
    per_process = 10
    port = api_server.server_address[1]
    with ExitStack() as stack:
        procs = []
        for i, (job, path) in enumerate(jobs):
            assert worker.claim_job(job.pk)  # as the worker's run_job does first
            config = config_to_run(job)  # the worker's rewrite: the team's key, the quota's limits
            env = stack.enter_context(apis.credential(job, config))
            spec = tmp_path / f"job-{i}.json"
            spec.write_text(json.dumps({"resources": config["resources"]}))
            # Only what a job's sandbox has: no server Redis URL, only the team's own user.
            clean = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HOME": str(tmp_path),
                     **env}
            procs.append(subprocess.Popen([sys.executable, str(CLIENT), str(spec), f"http://127.0.0.1:{port}{path}",
                                           str(per_process)], env=clean, stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for proc in procs:
            ready = proc.stdout.readline().strip()
            assert ready == "ready", proc.stderr.read()[-3000:]
        for proc in procs:  # every process starts sending at once
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = [proc.communicate(timeout=120) for proc in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [o[1][-2000:] for o in outputs]
    assert [int(o[0].strip()) for o in outputs] == [per_process] * 3
    team_a_calls, team_b_calls = api_server.by_path["/a"], api_server.by_path["/b"]
    assert len(team_a_calls) == 2 * per_process and len(team_b_calls) == per_process
    # Team A's two jobs together: within the provider's limit in every second, and paced as one budget at the
    # quota's rate (either job alone would have finished in half the time).
    assert most_in_one_second(team_a_calls) <= PROVIDER
    assert max(team_a_calls) - min(team_a_calls) >= (2 * per_process - BURST) / RATE * 0.9
    # Team B had a budget of its own: it went at its full rate while team A's was spent, so both teams
    # together went faster than one team's budget allows.
    assert most_in_one_second(team_b_calls) <= PROVIDER
    assert most_in_one_second(team_a_calls + team_b_calls) > PROVIDER
    assert max(team_b_calls) - min(team_b_calls) < (3 * per_process - BURST) / RATE * 0.5
    # The counters the dashboard shows are the team's, in Redis under the team's key.
    for slug, calls in (("team-a", 2 * per_process), ("team-b", per_process)):
        stats = server_redis.hgetall(f"{KEY_PREFIX}{apis.budget_key(slug, 'search')}:stats")
        assert float(stats[b"calls"]) == calls


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_job_in_its_sandbox_spends_its_teams_budget_through_its_teams_redis_user(
        alice_api: Any, team_a: Any, api_server: ProviderAPI, server_redis: redis.Redis, runs_dir: Path) -> None:
    from webapp.jobs import isolation, paths

    if not isolation.enabled():
        pytest.skip("AGENTFLY_JOB_SANDBOX=off")
    APIQuota.objects.create(team=team_a, api="search", rate=RATE, burst=BURST, concurrency=3)
    job = launch(alice_api, "team-a", builtin_entries())
    assert worker.claim_job(job.pk)
    config = config_to_run(job)
    output_dir = paths.job_dir(job)
    output_dir.mkdir(parents=True)
    spec = output_dir / "api.json"
    spec.write_text(json.dumps({"resources": config["resources"]}))
    with apis.credential(job, config) as env:
        sandbox = isolation.sandbox_for(job, output_dir, config, env)
        sandbox.readable.append(CLIENT.parent)  # the test's client script; the code is there already
        argv = [*isolation.sandbox_argv(sandbox), sys.executable, "-P", str(CLIENT), str(spec),
                f"http://127.0.0.1:{api_server.server_address[1]}/a", "3"]
        done = subprocess.run(argv, env=isolation.process_env(sandbox), input="go\n", capture_output=True, text=True,
                              timeout=90, pass_fds=sandbox.fds)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["ready", "3"]
    assert len(api_server.by_path["/a"]) == 3
    stats = server_redis.hgetall(f"{KEY_PREFIX}{apis.budget_key('team-a', 'search')}:stats")
    assert float(stats[b"calls"]) == 3
