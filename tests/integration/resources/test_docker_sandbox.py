"""PythonSandbox on the docker backend. Runs where a docker engine answers (``DOCKER_HOST``) and has the
image (``AGENTFLY_SANDBOX_IMAGE``, default python:3.11-slim); skipped elsewhere with the reason. CI's stack
step (scripts/stack_test.sh) starts an engine, builds the image from Debian's packages and runs them; it also
exposes the same engine over TLS on 127.0.0.1:2376 as a second "host" (``AGENTFLY_TEST_DOCKER_TCP``)."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentfly.context import RolloutContext
from agentfly.resources import (
    InfrastructureFailure,
    Limits,
    Pool,
    PythonSandbox,
    ResourceEngine,
    ResourceError,
    ResourceSpec,
)
from agentfly.resources.backends.docker import DEFAULT_IMAGE, DockerEngine, DockerEngines, sweep_engine
from agentfly.resources.sandbox import docker_available
from agentfly.tools import tool


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
pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.skipif(REASON is not None, reason=str(REASON))]


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


async def test_a_container_killed_from_outside_ends_the_rollout_as_killed_and_the_next_call_gets_a_new_one() -> None:
    async with PythonSandbox(backend="docker") as box:
        await box.run("x = 1")
        running = asyncio.ensure_future(box.run("import time; time.sleep(60)", timeout=120))
        await asyncio.sleep(0.5)
        await asyncio.to_thread(box.worker.container.kill)  # an operator's `docker kill`, an engine stopping it
        with pytest.raises(InfrastructureFailure) as failure:
            await running
        assert failure.value.kind == "killed" and "137" not in str(failure.value.kind)
        assert "NameError" in await box.run("x")  # a new container
    assert sandbox_containers() == []


async def test_the_sandboxes_own_code_cannot_kill_its_container_and_its_own_exit_is_an_observation() -> None:
    async with PythonSandbox(backend="docker") as box:
        # The worker is the container's PID 1: a signal from inside its PID namespace is ignored, so no code
        # in the sandbox can pass its own failure off as the infrastructure's.
        assert await box.run("import os, signal; os.kill(1, signal.SIGKILL); os.kill(1, signal.SIGTERM); 'alive'") \
            == "'alive'\n"
        out = await box.run("import os; os._exit(3)")  # no InfrastructureFailure: the model reads what it did
        assert out.startswith("Error: it exited with status 3; the sandbox was restarted"), out
        # The status a SIGKILL leaves, chosen by the code itself: the engine sent no signal, so it is still its own.
        out = await box.run("import os; os._exit(137)")
        assert out.startswith("Error: it exited with status 137; the sandbox was restarted"), out
        assert await box.run("6 * 7") == "42\n"
    assert sandbox_containers() == []


async def test_a_container_its_own_memory_limit_kills_is_an_observation_not_an_infrastructure_failure() -> None:
    # Each process stays under the address-space rlimit (160 MiB); together they pass the container's memory
    # (twice that), and the kernel kills the largest, the worker (PID 1) holding 100 MiB.
    code = ("import subprocess, sys, time\nheld = bytearray(100 << 20)\nchildren = [subprocess.Popen([sys.executable, "
            "'-c', 'import time; b = bytearray(70 << 20); time.sleep(60)']) for _ in range(5)]\ntime.sleep(30)")
    async with PythonSandbox(backend="docker", limits=Limits(memory_bytes=160 << 20, processes=32)) as box:
        out = await box.run(code, timeout=60)
        assert out.startswith("Error: its processes together used more than the container's memory (320 MiB) and "
                              "the kernel killed it; the sandbox was restarted"), out
        assert await box.run("1 + 1") == "2\n"
    assert sandbox_containers() == []


def inspect(box: PythonSandbox) -> dict[str, Any]:
    box.worker.container.reload()
    return dict(box.worker.container.attrs["HostConfig"])


async def test_a_docker_sandbox_gets_its_memory_cpu_and_process_limits_no_network_and_a_read_only_root() -> None:
    limits = Limits(memory_bytes=256 << 20, processes=32)
    async with PythonSandbox(backend="docker", limits=limits) as box:
        host = inspect(box)
        assert host["Memory"] == 512 << 20 and host["MemorySwap"] == 512 << 20  # twice the rlimit: headroom
        assert host["NanoCpus"] == 1_000_000_000 and host["PidsLimit"] == 32
        assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] is True
        assert host["CapDrop"] == ["ALL"] and "no-new-privileges" in host["SecurityOpt"]
        assert await box.run("import os; os.getuid()") == "65534\n"
        assert "lo" in await box.run("import socket; [n for _, n in socket.if_nameindex()]")
        assert "eth0" not in await box.run("import socket; [n for _, n in socket.if_nameindex()]")
        assert await box.run("open('/work/ok', 'w').write('x')") == "1\n"  # the tmpfs workdir is writable


@pytest.mark.slow
async def test_a_hundred_chaotic_rollouts_on_docker_leave_no_container_behind() -> None:
    rng = random.Random(11)
    codes = ["x = 1", "print(x)", "1/0", "import time; time.sleep(5)", "import os; os._exit(3)"]

    @tool(resource="python", timeout=8)
    async def py(code: str, context: Any) -> str:
        """Run code."""
        box = await context.resource("python")
        return await box.run(code, timeout=1)

    spec = ResourceSpec(name="python", factory=PythonSandbox, backend="docker", kind="sandbox",
                        pool=Pool(min=1, max=4), acquire_timeout=2)
    engine = ResourceEngine([spec])
    await engine.start()
    observations: list[str] = []

    async def rollout(i: int) -> None:
        ctx = RolloutContext(sample={}, rollout_id=f"r{i}", group_id="g", resources=engine)
        try:
            for _ in range(rng.randint(1, 2)):
                observations.append((await py.invoke({"code": rng.choice(codes)}, context=ctx)).observation)
                if rng.random() < 0.1:
                    ctx.mark_unhealthy("python")
        finally:
            await asyncio.shield(ctx.aclose())

    try:
        tasks = [asyncio.create_task(rollout(i)) for i in range(100)]
        for i in rng.sample(range(100), 15):
            asyncio.get_running_loop().call_later(rng.random() * 3, tasks[i].cancel)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        # Each rollout finished, was cancelled, or waited out the full pool: the infrastructure's failure,
        # which ends a rollout (the rollout loop would record its kind) instead of reaching the model.
        assert all(r is None or isinstance(r, asyncio.CancelledError)
                   or (isinstance(r, InfrastructureFailure) and r.kind == "acquire_timeout") for r in results), results
        assert any("ZeroDivisionError" in o for o in observations)  # real sandboxes ran code amid the chaos
        await engine.settle(120)
        stats = engine.stats()["python"]
        assert stats["in_use"] == 0 and stats["size"] <= 4 and stats["created"] == stats["size"] + stats["destroyed"]
        assert len(sandbox_containers()) == stats["size"]
    finally:
        await engine.aclose()  # never leave containers for the next test, however this one ended
    assert sandbox_containers() == []


# ------------------------------------------------------------------ sandboxes on more than one engine
TCP = os.environ.get("AGENTFLY_TEST_DOCKER_TCP")
CERTS = Path(os.environ.get("AGENTFLY_TEST_DOCKER_CERTS", "/nonexistent"))
needs_tcp = pytest.mark.skipif(
    TCP is None or not (CERTS / "ca.pem").is_file(),
    reason="no second engine: the local engine over TLS on 127.0.0.1:2376 exists when scripts/stack_test.sh "
    "started dockerd itself (AGENTFLY_TEST_DOCKER_TCP, AGENTFLY_TEST_DOCKER_CERTS); a dockerd that was already "
    "running has no such listener",
)


def remote(max: int | None = None) -> DockerEngine:
    return DockerEngine(TCP, tls_ca_cert=str(CERTS / "ca.pem"), tls_client_cert=str(CERTS / "cert.pem"),
                        tls_client_key=str(CERTS / "key.pem"), max=max)


@needs_tcp
async def test_a_pool_runs_its_sandboxes_on_the_engine_it_names_over_tls() -> None:
    spec = ResourceSpec(name="python", factory=PythonSandbox, backend="docker", pool=Pool(0, 1),
                        options={"base_url": TCP, "tls_ca_cert": str(CERTS / "ca.pem"),
                                 "tls_client_cert": str(CERTS / "cert.pem"), "tls_client_key": str(CERTS / "key.pem")})
    async with ResourceEngine([spec]) as engine:
        lease = await engine.acquire("python")
        assert await lease.instance.run("6 * 7") == "42\n"
        assert engine.stats()["python"]["isolation"]["engine"] == TCP
        await engine.release(lease)
    assert sandbox_containers() == []


@needs_tcp
async def test_an_engine_that_asks_for_a_client_certificate_refuses_a_client_without_one() -> None:
    box = PythonSandbox(backend="docker", engines=DockerEngines([DockerEngine(TCP, tls_ca_cert=str(CERTS / "ca.pem"))]))
    with pytest.raises(Exception, match=r"(?i)certificate|ssl|tls|connection"):
        await box.start()
    await box.close()
    assert sandbox_containers() == []


@needs_tcp
async def test_one_job_spreads_its_sandboxes_over_two_engines_within_each_engines_limit() -> None:
    engines = DockerEngines([DockerEngine(max=2), remote(max=3)])
    spec = ResourceSpec(name="python", factory=PythonSandbox, backend="docker", pool=Pool(0, 5),
                        options={"engines": engines})
    async with ResourceEngine([spec]) as engine:
        leases = await asyncio.gather(*(engine.acquire("python") for _ in range(5)))
        names = [lease.instance.worker.engine_name for lease in leases]
        assert sorted(names, key=str) == sorted([TCP, TCP, TCP, DockerEngine().name, DockerEngine().name], key=str)
        assert [e["in_use"] for e in engines.stats()] == [2, 3]
        assert all(await asyncio.gather(*(lease.instance.run("1") for lease in leases)))
        for lease in leases:
            await engine.release(lease)
        await engine.settle(60)
    assert [e["in_use"] for e in engines.stats()] == [0, 0] and sandbox_containers() == []


async def test_a_pool_larger_than_its_engines_limits_says_how_to_fix_it() -> None:
    engines = DockerEngines([DockerEngine(max=1)])
    first = PythonSandbox(backend="docker", engines=engines)
    second = PythonSandbox(backend="docker", engines=engines)
    async with first:
        with pytest.raises(ResourceError, match=r"at its limit \(.* 1/1\); lower the pool's max"):
            await second.start()
        await second.close()
    assert engines.stats()[0]["in_use"] == 0 and sandbox_containers() == []


class Hop:
    """A TCP hop in front of the engine's TLS port that the test can cut, as when the engine's host goes away:
    the client's connections to it (the attached stream included) break and new ones are refused."""

    def __init__(self, target: str) -> None:
        import socket
        import threading

        host, port = target.removeprefix("tcp://").rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[Any] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: Any, sink: Any) -> None:
        import contextlib

        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(2)

    def cut(self) -> None:
        import contextlib
        import socket

        self.listener.close()
        for s in self.sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
                s.close()


@needs_tcp
async def test_an_engine_that_stops_answering_mid_call_ends_the_rollout_as_server_down() -> None:
    import docker

    assert TCP is not None
    hop = Hop(TCP)
    engine = DockerEngine(f"tcp://127.0.0.1:{hop.port}", tls_ca_cert=str(CERTS / "ca.pem"),
                          tls_client_cert=str(CERTS / "cert.pem"), tls_client_key=str(CERTS / "key.pem"), timeout=10)
    box = PythonSandbox(backend="docker", engines=DockerEngines([engine]))
    try:
        await box.start()
        assert await box.run("6 * 7") == "42\n"
        running = asyncio.ensure_future(box.run("import time; time.sleep(60)", timeout=120))
        await asyncio.sleep(0.5)
        hop.cut()
        with pytest.raises(InfrastructureFailure) as failure:
            await asyncio.wait_for(running, 60)
        assert failure.value.kind == "server_down"
    finally:
        hop.cut()
        await box.close()
        for container in sandbox_containers():  # what the engine still runs for the client it lost
            container.remove(force=True)
    assert docker.from_env().ping()


# A trainer holding a docker sandbox: prints its container's id, then waits to be killed.
HOLDER = """
import asyncio
from agentfly.resources import PythonSandbox

async def main():
    box = PythonSandbox(backend="docker")
    await box.start()
    print(box.worker.container.id, flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""
NEXT = ("import asyncio\nfrom agentfly.resources import PythonSandbox\n"
        "async def main():\n    async with PythonSandbox(backend='docker') as box:\n        print(await box.run('1 + 1'))\n"
        "asyncio.run(main())")


def test_containers_a_sigkilled_trainer_left_are_removed_by_the_next_process_that_uses_the_engine() -> None:
    # A SIGKILLed trainer never closes its pools, and a container has no parent to die with: it would run on.
    # The next process on this host to use the engine removes it, and leaves a live trainer's alone.
    import docker

    client = docker.from_env()
    holders = [subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        killed_id, live_id = (h.stdout.readline().strip() for h in holders)  # type: ignore[union-attr]
        holders[0].kill()
        holders[0].wait()
        assert client.containers.get(killed_id).status == "running"  # left behind
        done = subprocess.run([sys.executable, "-c", NEXT], capture_output=True, text=True, timeout=120)
        assert done.stdout.strip() == "2", done.stderr[-2000:]
        ids = {c.id for c in sandbox_containers()}
        assert killed_id not in ids and live_id in ids
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()
        sweep_engine(client)
    assert sandbox_containers() == []
