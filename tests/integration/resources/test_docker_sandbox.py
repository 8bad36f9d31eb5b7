"""PythonSandbox on the docker backend. Runs where a docker engine answers (``DOCKER_HOST``) and has the
image (``AGENTFLY_SANDBOX_IMAGE``, default python:3.11-slim); skipped elsewhere with the reason."""

from __future__ import annotations

import pytest

from agentfly.resources import Pool, PythonSandbox, ResourceEngine, ResourceSpec
from agentfly.resources.backends.docker import DEFAULT_IMAGE
from agentfly.resources.sandbox import docker_available


def _skip_reason() -> str | None:
    reason = docker_available()
    if reason:
        return reason
    import docker

    try:
        docker.from_env().images.get(DEFAULT_IMAGE)
    except Exception:
        return f"the image {DEFAULT_IMAGE} is not pulled (docker pull {DEFAULT_IMAGE})"
    return None


REASON = _skip_reason()
pytestmark = [pytest.mark.integration, pytest.mark.skipif(REASON is not None, reason=str(REASON))]


def sandbox_containers() -> list:
    import docker

    return docker.from_env().containers.list(all=True, filters={"label": "agentfly.sandbox=1"})


async def test_a_docker_sandbox_keeps_state_has_no_network_and_is_removed_on_close() -> None:
    async with PythonSandbox(backend="docker") as box:
        await box.run("x = 41")
        assert await box.run("x + 1") == "42\n"
        out = await box.run("import socket\ns = socket.socket()\ns.settimeout(2)\ns.connect(('1.1.1.1', 80))")
        assert "OSError" in out
        assert "Read-only file system" in await box.run("open('/etc/x', 'w')")
        assert box.isolation()["network"] == "none (container)"
    assert sandbox_containers() == []


async def test_a_released_docker_sandbox_is_replaced_by_a_fresh_container() -> None:
    spec = ResourceSpec(name="python", factory=PythonSandbox, backend="docker", kind="sandbox", pool=Pool(0, 1))
    async with ResourceEngine([spec]) as engine:
        lease = await engine.acquire("python")
        await lease.instance.run("secret = 1")
        await engine.release(lease)
        await engine.settle()
        again = await engine.acquire("python")
        assert "NameError" in await again.instance.run("secret")
        assert engine.stats()["python"]["network_isolated"] is True
        await engine.release(again)
    assert sandbox_containers() == []


async def test_a_docker_sandbox_turns_memory_and_fork_attacks_into_observations() -> None:
    async with PythonSandbox(backend="docker") as box:
        assert "MemoryError" in await box.run("blocks = [bytearray(64 << 20) for _ in range(64)]")
        bomb = ("import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
                "            time.sleep(60)\n            os._exit(0)\n        n += 1\n"
                "except OSError as exc:\n    print('stopped after', n)")
        assert "stopped after" in await box.run(bomb, timeout=20)
        assert await box.run("'still alive'") == "'still alive'\n"
    assert sandbox_containers() == []
