"""A Ray cluster with token authentication that a process joins without its token is a typed failure at a
deadline, naming the setting, never ``ray.init``'s endless retry; with the token the process joins and its
pools run there. A real head (``ray start --head``) in a child process."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray")

from tests.webapp.helpers import free_port

ROOT = Path(__file__).resolve().parents[3]
RAY = str(Path(sys.executable).with_name("ray"))
JOIN = """
import sys, time
from agentfly.resources.backends.ray import connect
started = time.monotonic()
try:
    connect(sys.argv[1])
    import ray
    print("joined", len(ray.nodes()))
except Exception as exc:
    print(type(exc).__name__, round(time.monotonic() - started), exc)
"""


@pytest.fixture(scope="module")
def token_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    token, port = secrets.token_hex(32), free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "OMP_NUM_THREADS": "1"}
    temp = tmp_path_factory.mktemp("ray")
    subprocess.run([RAY, "start", "--head", f"--port={port}", "--num-cpus=1", "--include-dashboard=false",
                    "--disable-usage-stats", f"--temp-dir={temp}"], env=env, check=True, capture_output=True,
                   timeout=120)
    try:
        yield f"127.0.0.1:{port}", token
    finally:
        subprocess.run([RAY, "stop", "--force"], env=env, capture_output=True, timeout=120)


def join(address: str, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    out = subprocess.run([sys.executable, "-c", JOIN, address], env={**base, "OMP_NUM_THREADS": "1", **env},
                         capture_output=True, text=True, timeout=180, cwd=ROOT)
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_joining_a_token_cluster_without_its_token_fails_at_the_deadline_naming_the_token(
        token_cluster: tuple[str, str]) -> None:
    address, token = token_cluster
    started = time.monotonic()
    refused = join(address, RAY_AUTH_MODE="token", AGENTFLY_RAY_CONNECT_TIMEOUT="10")
    assert refused.startswith("ResourceError") and "RAY_AUTH_TOKEN" in refused, refused
    assert time.monotonic() - started < 90  # the deadline, not ray.init's retry every minute, forever
    assert join(address, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token) == "joined 1"
