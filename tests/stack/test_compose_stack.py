"""The docker-compose stack as a team would run it: images built here, web + worker-cpu + Redis + PostgreSQL
up and healthy, a job launched through the stack's own REST API that succeeds with its events stored and
streamed over its websocket, then ``docker compose down -v``.

Run by ``scripts/stack_test.sh`` (CI's stack step), which starts the engine and builds the images; anywhere
else these tests skip, naming what is missing.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.webapp.helpers import free_port, wait_for

pytestmark = [pytest.mark.stack, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "agentfly-stacktest"
IMAGES = {"agentfly:latest": "the app image (docker build -t agentfly .)",
          os.environ.get("AGENTFLY_REDIS_IMAGE", "redis:7-alpine"): "Redis",
          os.environ.get("AGENTFLY_POSTGRES_IMAGE", "postgres:16-alpine"): "PostgreSQL"}
SERVICES = ("web", "worker-cpu", "redis", "postgres")


def compose_command() -> list[str] | None:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return [shutil.which("docker-compose") or ""] if shutil.which("docker-compose") else None


def missing() -> str | None:
    """Why the stack cannot come up here, or None."""
    if shutil.which("docker") is None:
        return "no docker client (apt-get install docker.io)"
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        return "no docker engine answers (scripts/stack_test.sh starts dockerd)"
    if compose_command() is None:
        return "neither `docker compose` nor `docker-compose` is installed (apt-get install docker-compose)"
    for image, what in IMAGES.items():
        if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode != 0:
            return f"the image {image} ({what}) is not built; scripts/stack_test.sh builds it from this repository"
    return None


# The variables docker-compose.yml reads from the operator's environment with a default of its own.
COMPOSE_SETTINGS = {"DEBUG", "SECURE_SSL_REDIRECT", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE"}


class Stack:
    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        models, datasets = tmp / "models", tmp / "datasets"
        self.models = models
        models.mkdir()
        datasets.mkdir()
        # An operator's shell: none of the settings this test session gives the web app (the web fixtures set
        # DEBUG=1 for the in-process tests), which compose would otherwise pass into the containers.
        shell = {k: v for k, v in os.environ.items() if k not in COMPOSE_SETTINGS}
        self.env = {**shell, "SECRET_KEY": secrets.token_urlsafe(48), "REDIS_PASSWORD": secrets.token_hex(24),
                    "POSTGRES_PASSWORD": secrets.token_hex(24),
                    "RAY_AUTH_TOKEN": secrets.token_hex(32), "AGENTFLY_WEB_PORT": str(self.port),
                    "ALLOWED_HOSTS": "localhost,127.0.0.1", "CSRF_TRUSTED_ORIGINS": self.url,
                    "AGENTFLY_MODELS_DIR": str(models), "AGENTFLY_DATASETS_DIR": str(datasets),
                    "COMPOSE_PROJECT_NAME": PROJECT}
        self.compose = [*compose_command(), "-f", str(ROOT / "docker-compose.yml"), "-p", PROJECT]  # type: ignore[misc]

    def run(self, *args: str, input: str | None = None, timeout: float = 300, check: bool = True) -> str:
        result = subprocess.run([*self.compose, *args], cwd=ROOT, env=self.env, input=input, capture_output=True,
                                text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
        return result.stdout

    def exec(self, service: str, *command: str, input: str | None = None, check: bool = True) -> str:
        return self.run("exec", "-T", service, *command, input=input, check=check)

    def health(self) -> dict[str, str]:
        ids = self.run("ps", "-q").split()
        states = {}
        for cid in ids:
            info = json.loads(subprocess.run(["docker", "inspect", cid], capture_output=True, text=True).stdout)[0]
            name = info["Config"]["Labels"]["com.docker.compose.service"]
            states[name] = info["State"].get("Health", {}).get("Status", info["State"]["Status"])
        return states


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    reason = missing()
    if reason:
        pytest.skip(f"the compose stack cannot run here: {reason}")
    s = Stack(tmp_path_factory.mktemp("stack"))
    s.run("down", "-v", "--remove-orphans", check=False)  # what an interrupted earlier run left
    started = time.monotonic()
    try:
        s.run("up", "-d", "--no-build", "web", "worker-cpu", timeout=600)
        def all_healthy() -> dict[str, str] | None:
            states = s.health()
            return states if all(states.get(n) == "healthy" for n in SERVICES) else None

        healthy = wait_for(all_healthy, 420, "web, worker-cpu, redis and postgres to report healthy", 3)
        print(f"stack: healthy after {time.monotonic() - started:.0f} s: {healthy}")
        yield s
    except BaseException:
        print(s.run("logs", "--no-color", "--tail", "80", check=False))
        raise
    finally:
        # Every service's log, for reading after a failure (test-artifacts/ is kept by CI, ignored by git).
        artifacts = ROOT / "test-artifacts"
        artifacts.mkdir(exist_ok=True)
        (artifacts / "stack-compose.log").write_text(s.run("logs", "--no-color", check=False))
        s.run("down", "-v", "--remove-orphans", check=False)
        left = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={PROJECT}"],
                              capture_output=True, text=True).stdout.split()
        volumes = subprocess.run(["docker", "volume", "ls", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}"],
                                 capture_output=True, text=True).stdout.split()
        assert left == [] and volumes == [], f"compose down -v left containers {left} and volumes {volumes}"


def test_only_web_worker_cpu_redis_and_postgres_run_and_the_gpu_worker_waits_for_its_profile(stack: Stack) -> None:
    assert set(stack.health()) == set(SERVICES)  # worker-gpu is in the file (profile "gpu"), not started


def test_the_image_runs_as_a_user_with_cpu_torch_and_no_compiler_or_test_tools(stack: Stack) -> None:
    assert stack.exec("web", "id", "-un").strip() == "agentfly"
    assert stack.exec("worker-cpu", "id", "-u").strip() == "1000"
    found = stack.exec("web", "sh", "-c", "command -v gcc cc g++ make pip pytest; true").split()
    assert found == [], f"build or test tools in the final image: {found}"
    torch = stack.exec("worker-cpu", "python", "-c", "import torch; print(torch.__version__, torch.cuda.is_available())")
    assert torch.split() == ["2.13.0+cpu", "False"]


def test_check_deploy_is_clean_inside_the_container_with_composes_environment(stack: Stack) -> None:
    out = stack.exec("web", "python", "manage.py", "check", "--deploy", "--fail-level", "WARNING")
    assert "System check identified no issues" in out


def test_pages_and_their_static_files_are_served_with_debug_off_without_a_manual_collectstatic(stack: Stack) -> None:
    import requests

    page = requests.get(f"{stack.url}/login/", timeout=10)
    assert page.status_code == 200
    assets = re.findall(r'(?:href|src)="(/static/[^"]+)"', page.text)
    assert assets and all(re.search(r"\.[0-9a-f]{12}\.\w+$", a) for a in assets), assets  # hashed by the manifest
    for asset in assets:
        served = requests.get(stack.url + asset, timeout=10)
        assert served.status_code == 200 and "immutable" in served.headers.get("Cache-Control", ""), asset


def signed_in_api(stack: Stack, username: str, team: str) -> tuple[Any, str]:
    """A REST client with the token of a new user of a new team, and the user's password."""
    import requests

    password = secrets.token_urlsafe(16)
    out = stack.exec("web", "python", "manage.py", "createuser", username, "--team", team, "--password-stdin",
                     input=password + "\n")
    assert f"created user {username} in team" in out
    token = requests.post(f"{stack.url}/api/token/", data={"username": username, "password": password}, timeout=10)
    assert token.status_code == 200, token.text
    api = requests.Session()
    api.headers["Authorization"] = f"Token {token.json()['token']}"
    return api, password


def registered(stack: Stack, api: Any, names: set[str]) -> dict[str, int]:
    """The ids of the built-in entries ``names``, once the worker has registered them (it does when it starts)."""
    def found() -> dict[str, int] | None:
        entries = api.get(f"{stack.url}/api/registry/", params={"limit": 200}, timeout=10).json()
        ids = {e["name"]: e["id"] for e in entries.get("results", entries)}
        return ids if names <= set(ids) else None

    return wait_for(found, 120, f"the worker to register {sorted(names)}", 2)


def finished_job(stack: Stack, api: Any, job_id: int, timeout: float = 600) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        job: dict[str, Any] = api.get(f"{stack.url}/api/jobs/{job_id}/", timeout=10).json()
        return job if job["status"] in ("succeeded", "failed", "cancelled") else None

    return wait_for(finished, timeout, f"job {job_id} to finish", 2)


def test_a_cpu_job_launched_through_the_rest_api_succeeds_with_its_events_stored_and_streamed(stack: Stack) -> None:
    import requests
    from websockets.sync.client import connect

    api, password = signed_in_api(stack, "carol", "Stack Team")
    entry = registered(stack, api, {"calculator", "math_equal"})
    launched = api.post(f"{stack.url}/api/jobs/", json={
        "name": "stack test", "team": "stack-team", "tools": [entry["calculator"]], "reward": entry["math_equal"],
        "steps": 2, "prompts_per_step": 2, "group_size": 2, "max_turns": 2, "max_new_tokens": 12, "eval_size": 2,
        "save_every": 1, "queue": "cpu"}, timeout=30)
    assert launched.status_code == 201, launched.text
    job_id = launched.json()["id"]
    started = time.monotonic()
    done = finished_job(stack, api, job_id)
    print(f"stack: job {job_id} {done['status']} in {time.monotonic() - started:.0f} s")
    assert done["status"] == "succeeded", done["error"]
    events = api.get(f"{stack.url}/api/jobs/{job_id}/events/", params={"limit": 5000}, timeout=10).json()["events"]
    assert [e["seq"] for e in events] == list(range(1, done["last_seq"] + 1))
    assert {"metrics", "samples", "status"} <= {e["type"] for e in events}, (
        events, stack.run("logs", "--no-color", "--tail", "60", "worker-cpu", check=False))
    assert [e["data"]["state"] for e in events if e["type"] == "status"][-1] == "succeeded"

    # The dashboard's socket, from a real client on the host: signed in by session, from an allowed origin.
    browser = requests.Session()
    form = browser.get(f"{stack.url}/login/", timeout=10).text
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)  # type: ignore[union-attr]
    signed_in = browser.post(f"{stack.url}/login/", data={"username": "carol", "password": password,
                                                          "csrfmiddlewaretoken": csrf},
                             headers={"Referer": f"{stack.url}/login/"}, timeout=10, allow_redirects=False)
    assert signed_in.status_code == 302, signed_in.text[:500]
    cookie = "; ".join(f"{c.name}={c.value}" for c in browser.cookies)
    streamed: list[int] = []
    with connect(f"ws://127.0.0.1:{stack.port}/ws/jobs/{job_id}/",
                 additional_headers={"Cookie": cookie, "Origin": stack.url}, open_timeout=10) as ws:
        hello = json.loads(ws.recv(timeout=10))
        assert hello["type"] == "hello" and hello["job"]["status"] == "succeeded"
        while True:
            message = json.loads(ws.recv(timeout=10))
            if message["type"] == "live":
                assert message["last_seq"] == done["last_seq"]
                break
            streamed += [e["seq"] for e in message["events"]]
    assert streamed == list(range(1, done["last_seq"] + 1))


# On the Ray head: the ids of the alive nodes with room for environments, and the cluster's alive actors.
RAY_STATE = """
import json, ray
from ray._private import state
ray.init(address="auto", logging_level="ERROR")
nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("sandbox")]
alive = [a.get("Name") or a["ActorClassName"] for a in state.actors().values() if a["State"] == "ALIVE"]
print(json.dumps({"sandbox_nodes": nodes, "alive_actors": alive}))
"""


def ray_state(stack: Stack) -> dict[str, list[str]]:
    out = stack.exec("ray-head", "python", "-c", RAY_STATE)
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_jobs_environments_run_on_the_ray_worker_node_and_nothing_of_the_job_is_left_on_the_cluster(
        stack: Stack) -> None:
    stack.run("up", "-d", "--no-build", "ray-head", "ray-worker", timeout=300)
    wait_for(lambda: all(stack.health().get(n) == "healthy" for n in ("ray-head", "ray-worker")) or None, 300,
             "the Ray head and worker to report healthy", 5)
    cluster = ray_state(stack)
    assert len(cluster["sandbox_nodes"]) == 1, cluster  # the worker; the head has no room for environments
    (worker_node,) = cluster["sandbox_nodes"]
    # The key-chain agent from its warm start looks keys up in every rollout, in a store leased per rollout:
    # with AGENTFLY_RAY_ADDRESS set (compose's default) each store is an actor on the cluster.
    shutil.copytree(ROOT / "examples" / "key_chain" / "warm_start", stack.models / "key_chain")
    api, _ = signed_in_api(stack, "dora", "Ray Team")
    entry = registered(stack, api, {"lookup", "chain_answer"})
    job = {"team": "ray-team", "tools": [entry["lookup"]], "reward": entry["chain_answer"], "model_source": "path",
           "model_path": "/data/models/key_chain", "task": "key_chain", "task_size": 16, "prompts_per_step": 2,
           "group_size": 2, "max_turns": 6, "max_new_tokens": 32, "eval_size": 2, "save_every": 1, "queue": "cpu",
           "resources": {"kv": {"max": 4}}}
    launched = api.post(f"{stack.url}/api/jobs/", json={**job, "name": "on ray", "steps": 2}, timeout=30)
    assert launched.status_code == 201, launched.text
    job_id = launched.json()["id"]
    done = finished_job(stack, api, job_id)
    assert done["status"] == "succeeded", done["error"]
    events = api.get(f"{stack.url}/api/jobs/{job_id}/events/", params={"type": "resources", "limit": 5000},
                     timeout=10).json()["events"]
    placed = {node for e in events for pool in e["data"]["pools"].values() for node in pool.get("nodes", {})
              if node != "pending"}
    created = max(e["data"]["pools"]["kv"]["created"] for e in events)
    assert created >= 1 and placed == {worker_node}, (created, placed, worker_node)

    def left_clean() -> dict[str, list[str]] | None:
        """The job's coordinator and every store it leased are gone; the team's budget ledger ("team:<slug>",
        one per team for all its jobs) stays."""
        now = ray_state(stack)
        left.append(now)
        return now if [a for a in now["alive_actors"] if not a.startswith("team:")] == [] else None

    left: list[dict[str, list[str]]] = []

    try:
        assert wait_for(left_clean, 60, "the job's actors to leave the cluster", 2)["sandbox_nodes"] == [worker_node]
    except AssertionError:
        raise AssertionError(f"left on the cluster: {left[-1]}") from None

    # A job cancelled while its rollouts hold stores leaves nothing on the cluster either.
    long = api.post(f"{stack.url}/api/jobs/", json={**job, "name": "cancelled on ray", "steps": 500}, timeout=30)
    assert long.status_code == 201, long.text
    long_id = long.json()["id"]
    wait_for(lambda: api.get(f"{stack.url}/api/jobs/{long_id}/", timeout=10).json()["step"] >= 1 or None, 300,
             "the long job's first step", 2)
    assert api.post(f"{stack.url}/api/jobs/{long_id}/cancel/", timeout=10).status_code in (200, 202)
    assert finished_job(stack, api, long_id)["status"] == "cancelled"
    try:
        wait_for(left_clean, 60, "the cancelled job's actors to leave the cluster", 2)
    except AssertionError:
        raise AssertionError(f"left on the cluster: {left[-1]}") from None
