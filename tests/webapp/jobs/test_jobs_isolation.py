"""A job runs as its team: a team's reward, run by the trainer on a real Celery worker, reaches no secret, no
other team's folder and neither database, and the job still trains with its events stored."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from tests.webapp.helpers import wait_for
from webapp.jobs.models import Status, TrainingJob
from webapp.registry.models import Entry, EntryStatus

pytestmark = pytest.mark.integration

PLUGINS = Path(settings.AGENTFLY_PLUGIN_DIRS[0])

# Every attack records what it got into a file of its own team's folder (which it may write), so the test
# reads the outcome of each step; then it returns a reward so the job trains on.
SPY = '''
"""Team A's reward: it tries to reach what is not team A's."""
import json
import os
import socket
from pathlib import Path

from agentfly.rewards import reward

OTHER = Path({other!r})
REPORT = Path({report!r})


def _connects(address):
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect(address)
        return True
    except OSError:
        return False


@reward
def spy(final_answer: str | None) -> float:
    found = {{name: os.environ.get(name) for name in
              ("SECRET_KEY", "DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND")}}
    leaked = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if b"SECRET_KEY=" in environ.read_bytes():
                leaked.append(str(environ))
        except OSError:
            pass
    found["proc_environ"] = leaked
    with open("/proc/self/status") as status:
        found["capabilities"] = {{line.split(":")[0]: line.split()[1] for line in status
                                  if line.startswith(("CapEff", "CapPrm", "CapBnd"))}}
    found["uid"] = os.getuid()
    try:
        found["other_config"] = (OTHER / "config.yaml").read_text()
    except OSError:
        found["other_config"] = None
    try:
        (OTHER / "pwned.txt").write_text("team A was here")
        found["wrote_other"] = True
    except OSError:
        found["wrote_other"] = False
    found["postgres_tcp"] = _connects(("127.0.0.1", 5432))
    found["redis_tcp"] = _connects(("127.0.0.1", 6379))
    found["postgres_socket"] = any(_connects(p) for p in ("/var/run/postgresql/.s.PGSQL.5432",
                                                           "/run/postgresql/.s.PGSQL.5432", "/tmp/.s.PGSQL.5432"))
    found["redis_socket"] = any(_connects(p) for p in ("/var/run/redis/redis-server.sock", "/run/redis/redis.sock",
                                                        "/tmp/redis.sock"))
    REPORT.write_text(json.dumps(found))
    return 1.0 if final_answer else 0.0
'''


@contextlib.contextmanager
def team_plugin(slug: str, name: str, text: str) -> Iterator[Path]:
    """A module in team ``slug``'s plugin folder of the session worker, removed afterwards."""
    folder = PLUGINS / slug
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(text)
    try:
        yield path
    finally:
        path.unlink()
        with contextlib.suppress(OSError):
            folder.rmdir()


def register_reward(api: Any, import_path: str) -> Entry:
    response = api.post("/api/registry/", {"kind": "reward", "import_path": import_path, "team": "team-a"},
                        format="json")
    assert response.status_code == 202, response.content
    entry = wait_for(lambda: Entry.objects.exclude(status=EntryStatus.PENDING).filter(pk=response.json()["id"])
                     .first(), 60, "the worker to inspect the reward")
    assert entry.status == EntryStatus.READY, entry.error
    return entry


def test_a_teams_reward_reaches_no_secret_no_capability_no_other_team_and_no_database_and_the_job_still_trains(
        alice_api: Any, builtins: dict[str, Any], runs_dir: Path, team_b: Any) -> None:
    other = runs_dir / "team-b" / "job-999999"  # another team's job, as its run left it
    other.mkdir(parents=True, exist_ok=True)
    (other / "config.yaml").write_text("model: {path: /models/team-b-secret-model}\n")
    report = runs_dir / "team-a" / "spy-report.json"
    report.unlink(missing_ok=True)
    with team_plugin("team-a", "spy_reward", SPY.format(other=str(other), report=str(report))):
        reward = register_reward(alice_api, "agentfly_teams.team_a.spy_reward:spy")
        response = alice_api.post("/api/jobs/", {
            "name": "spy", "team": "team-a", "tools": [builtins["calculator"].pk], "reward": reward.pk, "steps": 2,
            "prompts_per_step": 1, "group_size": 2, "max_turns": 1, "max_new_tokens": 4, "eval_size": 1,
            "save_every": 1}, format="json")
        assert response.status_code == 201, response.content
        job_id = response.json()["id"]
        job = wait_for(lambda: TrainingJob.objects.filter(pk=job_id, status__in=Status.values[2:5]).first(), 240,
                       "the job to finish", 0.5)
    assert job.status == Status.SUCCEEDED, job.error
    found = json.loads(report.read_text())
    # (a) no secret in its environment, nor in any process's environment it can see
    assert {k: v for k, v in found.items() if k.isupper() and v} == {}
    assert found["proc_environ"] == []
    # (a') no capability at all (effective, permitted, bounding), and not root's uid
    assert found["capabilities"] == {"CapEff": "0" * 16, "CapPrm": "0" * 16, "CapBnd": "0" * 16}
    assert found["uid"] != 0
    # (b) another team's job config is not there to read; (c) nor its folder to write
    assert found["other_config"] is None
    assert found["wrote_other"] is False and not (other / "pwned.txt").exists()
    # (d) neither database answers it, over TCP or a Unix socket
    assert not (found["postgres_tcp"] or found["redis_tcp"] or found["postgres_socket"] or found["redis_socket"])
    # ... and the job trained, its events stored through the worker.
    events = alice_api.get(f"/api/jobs/{job_id}/events/?type=metrics&limit=5000").json()["events"]
    assert sorted({e["step"] for e in events}) == [1, 2]
    assert job.step == 2 and job.checkpoints.filter(step=2).exists()


# A job's own tools still get sandboxes of their own inside the job's sandbox: code a model wrote runs there,
# confined further, and is never an infrastructure failure of every rollout.
SANDBOX_IN_JOB = """
import asyncio
from agentfly.resources import PythonSandbox

async def main():
    async with PythonSandbox() as box:
        print(box.isolation()["user"])
        print(await box.run("print(6 * 7)"), end="")

asyncio.run(main())
"""


def test_a_python_sandbox_starts_and_runs_code_inside_a_jobs_sandbox(runs_dir: Path) -> None:
    import subprocess
    import sys

    from webapp.jobs import isolation

    output = runs_dir / "team-a" / "job-sandbox-in-job"
    output.mkdir(parents=True, exist_ok=True)
    uid = isolation.TEAM_UID_BASE + 1  # a team's uid, as a root worker runs its jobs
    os.chown(output, uid, uid)
    sandbox = isolation.Sandbox(job_id=0, team_slug="team-a", output_dir=output, writable=[output], uid=uid)
    done = subprocess.run([*isolation.sandbox_argv(sandbox), sys.executable, "-P", "-c", SANDBOX_IN_JOB],
                          env=isolation.process_env(sandbox), capture_output=True, text=True, timeout=120,
                          pass_fds=sandbox.fds)
    assert done.returncode == 0, done.stderr[-2000:]
    user, answer = done.stdout.splitlines()[-2:]
    assert answer == "42"
    assert "user namespace" in user or user.startswith("uid "), user


def test_a_job_whose_pools_run_on_the_ray_cluster_may_reach_it_and_others_keep_their_own_loopback(
        settings: Any) -> None:
    from webapp.jobs import cluster, isolation

    settings.AGENTFLY_JOB_NETWORK = "auto"
    settings.AGENTFLY_RAY_ADDRESS = "ray-head:6379"
    pooled = {"steps": 2, "resources": {"python": {"max": 2}}}
    assert isolation.network_for(cluster.with_ray(pooled, 7, "team-a")) == "host"
    assert isolation.network_for(cluster.with_ray({"steps": 2}, 7, "team-a")) == "none"  # no pool: not on it
    settings.AGENTFLY_RAY_ADDRESS = ""
    assert isolation.network_for(cluster.with_ray(pooled, 7, "team-a")) == "none"
    settings.AGENTFLY_JOB_NETWORK = "none"  # the operator's choice stands
    settings.AGENTFLY_RAY_ADDRESS = "ray-head:6379"
    assert isolation.network_for(cluster.with_ray(pooled, 7, "team-a")) == "none"


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_code_repair_job_from_the_api_runs_git_and_pytest_in_forked_workspaces_inside_its_sandbox(
        alice_api: Any, builtins: dict[str, Any]) -> None:
    """A coding agent's workspace is a bubblewrap root nested in the job's own (without a /proc of its own,
    which the kernel refuses there): the group's forks of one prepared repository, and the reward's test run."""
    response = alice_api.post("/api/jobs/", {
        "name": "repair", "team": "team-a", "task": "code_repair", "task_size": 8,
        "tools": [builtins[n].pk for n in ("bash", "read_file", "write_file", "run_tests")],
        "reward": builtins["repair_tests"].pk, "steps": 1, "prompts_per_step": 1, "group_size": 2, "max_turns": 1,
        "max_new_tokens": 4, "eval_size": 1, "save_every": 1, "resources": {"workspace": {"max": 2}}}, format="json")
    assert response.status_code == 201, response.content
    job_id = response.json()["id"]
    job = wait_for(lambda: TrainingJob.objects.filter(pk=job_id, status__in=Status.values[2:5]).first(), 360,
                   "the job to finish", 0.5)
    assert job.status == Status.SUCCEEDED, job.error
    events = alice_api.get(f"/api/jobs/{job_id}/events/?type=samples&limit=10").json()["events"]
    trajectories = events[0]["data"]["trajectories"]
    assert len(trajectories) == 2 and not any(t.get("failure") for t in trajectories)
    for t in trajectories:  # pytest ran in the rollout's fork and reported on the project's tests
        assert " passed" in t["artifacts"]["tests"] or " failed" in t["artifacts"]["tests"], t["artifacts"]
        assert t["reward_metrics"]["edited_tests"] == 0 and 0 <= t["reward"] < 1  # the bug is still there
