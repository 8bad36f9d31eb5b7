"""An MCP server as a pooled resource, against the real key-value server (``agentfly/resources/mcp_servers/
kv_store.py``, the official SDK) over stdio (sandboxed child) and streamable HTTP on loopback."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

import agentfly as af
from agentfly.context import RolloutContext
from agentfly.resources import InfrastructureFailure
from agentfly.resources.mcp import MCPSession

STORE = str(Path(af.__file__).parent / "resources" / "mcp_servers" / "kv_store.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_http(port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, STORE, "--http", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the HTTP MCP server did not come up")


@pytest.fixture
def http_server() -> Iterator[tuple[str, int, list[subprocess.Popen[bytes]]]]:
    port = _free_port()
    procs = [_start_http(port)]
    try:
        yield f"http://127.0.0.1:{port}/mcp", port, procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _spec(transport: str, url: str | None, **kw: Any) -> af.ResourceSpec:
    if transport == "http":
        return af.mcp.server("kv", url=url, **kw)
    if transport == "stdio-reset-tool":
        return af.mcp.server("kv", command=[sys.executable, STORE], reset_tool="reset", **kw)
    return af.mcp.server("kv", command=[sys.executable, STORE], **kw)


TRANSPORTS = ["stdio", "stdio-reset-tool", "http"]


@pytest.fixture(params=TRANSPORTS)
def spec_maker(request: pytest.FixtureRequest) -> Any:
    url = None
    if request.param == "http":
        url = request.getfixturevalue("http_server")[0]
    return lambda **kw: _spec(request.param, url, **kw)


async def _rollout(engine: af.ResourceEngine, tools: dict[str, Any], rid: str,
                   calls: list[tuple[str, dict[str, Any]]], pause: float = 0.0) -> list[Any]:
    ctx = RolloutContext(sample={}, rollout_id=rid, group_id="g", resources=engine)
    results = []
    try:
        for name, args in calls:  # one call per turn
            results.append(await tools[name].invoke(args, ctx))
            await asyncio.sleep(pause)
    finally:
        await ctx.aclose()
    return results


def test_tools_from_returns_the_servers_tools_with_its_schemas() -> None:
    spec = af.mcp.server("kv", command=[sys.executable, STORE], reset_tool="reset")
    tools = {t.name: t for t in af.mcp.tools_from(spec)}
    assert {"put", "get", "keys", "lookup"} <= set(tools)
    assert "reset" not in tools  # the pool's reset tool is not the model's
    put = tools["put"]
    assert put.resource == "kv"
    assert put.parameters["required"] == ["key", "value"]
    assert put.parameters["properties"]["key"]["type"] == "string"
    assert put.schema["function"]["description"].startswith("Store a value")


async def test_a_seed_tool_loads_each_rollouts_own_sample_before_its_first_call_and_is_hidden_from_the_model(
        spec_maker: Any) -> None:
    spec = spec_maker(pool=af.Pool(0, 2), seed_tool="seed")
    tools = {t.name: t for t in await af.mcp.atools_from(spec)}
    assert "seed" not in tools and "lookup" in tools
    samples = {"a": {"start": "k1", "links": {"k1": "k2"}, "answer": "11", "question": "?"},
               "b": {"start": "k7", "links": {"k7": "k8"}, "answer": "77", "question": "?"}}

    async def walk(rid: str) -> list[str]:
        sample = samples[rid]
        ctx = RolloutContext(sample=sample, rollout_id=rid, group_id="g", resources=engine)
        try:  # the sample's chain, seeded once (a second seed would restart the walk)
            first = await tools["lookup"].invoke({"key": sample["start"]}, ctx)
            second = await tools["lookup"].invoke({"key": first.observation.removeprefix("next: ")}, ctx)
            return [first.observation, second.observation]
        finally:
            await ctx.aclose()

    async with af.ResourceEngine([spec]) as engine:
        a, b = await asyncio.gather(walk("a"), walk("b"))
    assert a == ["next: k2", "final: 11"] and b == ["next: k8", "final: 77"]


def test_a_seed_tool_the_server_does_not_list_is_refused_naming_the_listing() -> None:
    with pytest.raises(ValueError, match=r"no tool 'load' \(its seed_tool\).*'lookup'"):
        af.mcp.tools_from(af.mcp.server("kv", command=[sys.executable, STORE], seed_tool="load"))


async def test_two_concurrent_rollouts_never_see_each_others_state(spec_maker: Any) -> None:
    spec = spec_maker(pool=af.Pool(0, 2))
    tools = {t.name: t for t in await af.mcp.atools_from(spec)}
    async with af.ResourceEngine([spec]) as engine:
        a, b = await asyncio.gather(
            _rollout(engine, tools, "a", [("put", {"key": "x", "value": "from-a"}), ("keys", {}), ("get", {"key": "x"})], 0.05),
            _rollout(engine, tools, "b", [("put", {"key": "y", "value": "from-b"}), ("keys", {}), ("get", {"key": "x"})], 0.05),
        )
    assert a[1].observation == '{"result": ["x"]}' or a[1].observation == '["x"]' or "x" in a[1].observation
    assert "y" not in a[1].observation and "x" not in b[1].observation
    assert a[2].observation == "from-a"
    assert not b[2].ok and "no key 'x'" in b[2].observation


async def test_a_rollouts_later_turns_see_its_earlier_writes_and_the_next_rollout_starts_clean(spec_maker: Any) -> None:
    spec = spec_maker(pool=af.Pool(0, 1))  # one session: the second rollout gets the same instance, reset
    tools = {t.name: t for t in await af.mcp.atools_from(spec)}
    async with af.ResourceEngine([spec]) as engine:
        first = await _rollout(engine, tools, "r1", [("put", {"key": "k", "value": "v1"}), ("get", {"key": "k"})])
        second = await _rollout(engine, tools, "r2", [("get", {"key": "k"}), ("keys", {})])
        stats = engine.stats()["kv"]
    assert first[1].observation == "v1"
    assert not second[0].ok and "no key 'k'" in second[0].observation
    assert "k" not in second[1].observation.replace("keys", "")
    assert stats["created"] == 1  # the one session was reset (reopened or restarted in place), not replaced


async def test_bad_arguments_and_tool_errors_are_observations(spec_maker: Any) -> None:
    spec = spec_maker(pool=af.Pool(0, 1))
    tools = {t.name: t for t in await af.mcp.atools_from(spec)}
    async with af.ResourceEngine([spec]) as engine:
        bad, missing = await _rollout(engine, tools, "r", [("put", {"key": 3}), ("get", {"key": "nope"})])
    assert not bad.ok and "'value' is a required property" in bad.observation and "3 is not of type 'string'" in bad.observation
    assert not missing.ok and "no key 'nope'" in missing.observation


@pytest.mark.slow
async def test_the_pool_never_exceeds_max_under_many_concurrent_rollouts(spec_maker: Any) -> None:
    spec = spec_maker(pool=af.Pool(0, 2), acquire_timeout=120)
    tools = {t.name: t for t in await af.mcp.atools_from(spec)}
    peak = 0
    async with af.ResourceEngine([spec]) as engine:
        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, engine.stats()["kv"]["size"])
                await asyncio.sleep(0.01)

        watcher = asyncio.create_task(watch())
        results = await asyncio.gather(*(
            _rollout(engine, tools, f"r{i}", [("put", {"key": f"k{i}", "value": str(i)}), ("keys", {})])
            for i in range(5)))
        watcher.cancel()
    assert peak <= 2
    for i, (_, listing) in enumerate(results):  # each rollout saw only its own key
        assert f"k{i}" in listing.observation and all(f"k{j}" not in listing.observation for j in range(5) if j != i)


async def test_a_stdio_server_killed_mid_rollout_is_an_infrastructure_failure_and_is_replaced() -> None:
    spec = af.mcp.server("kv", command=[sys.executable, STORE], pool=af.Pool(0, 1))
    tools = {t.name: t for t in await af.mcp.atools_from(spec)}
    async with af.ResourceEngine([spec]) as engine:
        ctx = RolloutContext(sample={}, rollout_id="doomed", group_id="g", resources=engine)
        try:
            assert (await tools["put"].invoke({"key": "k", "value": "v"}, ctx)).ok
            session: MCPSession = await ctx.resource("kv")
            assert session.worker is not None and session.worker.pid is not None
            os.kill(session.worker.pid, signal.SIGKILL)  # the server dies between two turns
            await asyncio.sleep(0.2)
            with pytest.raises(InfrastructureFailure) as failure:
                await tools["get"].fn({"key": "k"}, ctx)
            assert failure.value.kind == "instance_crashed"
        finally:
            await ctx.aclose()
        after = await _rollout(engine, tools, "next", [("put", {"key": "a", "value": "1"}), ("get", {"key": "a"})])
        stats = engine.stats()["kv"]
    assert after[1].observation == "1"  # a fresh server answers the next rollout
    assert stats["destroyed"] >= 1 and stats["created"] == 2


async def test_each_stdio_server_runs_as_a_private_uid_of_its_own_so_closing_one_never_kills_another() -> None:
    # Under bubblewrap every server is pid 2 of its own namespace; the uid must come from the parent. When they
    # all became the same uid, closing one session killed every other server (its cleanup kills its uid).
    spec = af.mcp.server("kv", command=[sys.executable, STORE], pool=af.Pool(0, 3))
    async with af.ResourceEngine([spec]) as engine:
        leases = [await engine.acquire("kv", owner=f"r{i}") for i in range(3)]
        workers = [lease.instance.worker for lease in leases]
        uids = [w.uid for w in workers]
        if uids[0] is None:
            pytest.skip("not root: the servers keep this user's uid (" + str(workers[0].report.get("user")) + ")")
        assert len(set(uids)) == 3, uids
        await leases[0].instance.close()  # one server goes (a failed health check, a replaced instance)
        for lease in leases[1:]:
            assert lease.instance.worker.alive
            await lease.instance.call("put", {"key": "k", "value": "v"})
            assert await lease.instance.call("get", {"key": "k"}) == "v"
        for lease in leases[1:]:
            await engine.release(lease)


async def test_an_http_server_that_goes_down_mid_rollout_is_an_infrastructure_failure(
        http_server: tuple[str, int, list[subprocess.Popen[bytes]]]) -> None:
    url, port, procs = http_server
    spec = af.mcp.server("kv", url=url, pool=af.Pool(0, 1), call_timeout=5)
    tools = {t.name: t for t in await af.mcp.atools_from(spec)}
    async with af.ResourceEngine([spec]) as engine:
        ctx = RolloutContext(sample={}, rollout_id="doomed", group_id="g", resources=engine)
        try:
            assert (await tools["put"].invoke({"key": "k", "value": "v"}, ctx)).ok
            procs[0].kill()
            procs[0].wait()
            with pytest.raises(InfrastructureFailure) as failure:
                await tools["get"].fn({"key": "k"}, ctx)
            assert failure.value.kind == "server_down"
        finally:
            await ctx.aclose()
        procs.append(_start_http(port))  # the operator brings it back: the next rollout gets a new session
        after = await _rollout(engine, tools, "next", [("put", {"key": "a", "value": "1"}), ("get", {"key": "a"})])
    assert after[1].observation == "1"


async def test_a_stdio_server_runs_sandboxed_without_network_or_the_parents_secrets() -> None:
    os.environ["AGENTFLY_TEST_SECRET"] = "hunter2"
    try:
        spec = af.mcp.server("kv", command=[sys.executable, STORE])
        session = MCPSession(spec)
        await session.start()
        try:
            report = session.isolation()
            assert session.worker is not None and session.worker.pid is not None
            env = Path(f"/proc/{session.worker.pid}/environ").read_bytes().split(b"\0")
        finally:
            await session.close()
    finally:
        del os.environ["AGENTFLY_TEST_SECRET"]
    assert not any(e.startswith(b"AGENTFLY_TEST_SECRET") for e in env)
    assert report["transport"] == "stdio"
    if report.get("network") != "allowed" and "namespace" in str(report.get("network")):
        assert report["network"].startswith("namespace")  # the network namespace, from bubblewrap where used
    assert "memory_bytes" in report["limits"]


async def test_the_key_chain_tool_over_mcp_shows_the_same_schema_and_earns_the_reward_only_after_the_walk() -> None:
    import importlib

    builtin = importlib.import_module("agentfly.tools.builtin.lookup")
    over_mcp = importlib.import_module("agentfly.tools.builtin.mcp_lookup")
    assert over_mcp.lookup.schema == builtin.lookup.schema  # the prompt a warm-started model reads is unchanged
    spec = over_mcp.KEY_CHAIN_MCP.replace(pool=af.Pool(0, 1))
    sample = {"id": "s", "start": "k1", "links": {"k1": "k7", "k7": "k3"}, "answer": "421"}
    rewards = []
    async with af.ResourceEngine([spec]) as engine:
        for keys in (["k1", "k7", "k3"], ["k1"]):  # the full walk, then a rollout that stops early
            ctx = RolloutContext(sample=sample, rollout_id="r", group_id="g", resources=engine)
            try:
                seen = [(await over_mcp.lookup.invoke({"key": k}, ctx)).observation for k in keys]
                rewards.append(await over_mcp.chain_answer.fn(final_answer="421", answer="421", context=ctx))
            finally:
                await ctx.aclose()
            if len(keys) == 3:
                assert seen == ["next: k7", "next: k3", "final: 421"]
    assert rewards[0] == {"reward": 1.0, "lookups": 3.0, "reached_final": 1.0}
    assert rewards[1]["reward"] == 0.0 and rewards[1]["lookups"] == 1.0  # reset between rollouts: a fresh walk


async def test_a_redirect_to_another_origin_is_not_followed(
        http_server: tuple[str, int, list[subprocess.Popen[bytes]]]) -> None:
    """An allowlisted URL that redirects elsewhere (here: to the real server on another port) gets no session."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    target = http_server[0]

    class Redirect(BaseHTTPRequestHandler):
        def _go(self) -> None:
            self.send_response(307)
            self.send_header("Location", target)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = do_DELETE = _go

        def log_message(self, *args: object) -> None:
            pass

    redirector = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    thread = threading.Thread(target=redirector.serve_forever, daemon=True)
    thread.start()
    try:
        spec = af.mcp.server("kv", url=f"http://127.0.0.1:{redirector.server_address[1]}/mcp", start_timeout=15)
        with pytest.raises(InfrastructureFailure) as refused:
            await af.mcp.atools_from(spec)
        assert refused.value.kind == "server_down"
        assert "redirect" in str(refused.value).lower(), str(refused.value)
    finally:
        redirector.shutdown()
        redirector.server_close()


async def test_a_global_server_is_one_session_shared_by_every_rollout(
        http_server: tuple[str, int, list[subprocess.Popen[bytes]]]) -> None:
    spec = af.mcp.server("kv", url=http_server[0], scope="global")
    tools = {t.name: t for t in await af.mcp.atools_from(spec)}
    async with af.ResourceEngine([spec]) as engine:
        await asyncio.gather(*(_rollout(engine, tools, f"r{i}", [("put", {"key": f"k{i}", "value": "v"})])
                               for i in range(3)))
        (listing,) = await _rollout(engine, tools, "reader", [("keys", {})])
        stats = engine.stats()["kv"]
    assert all(f"k{i}" in listing.observation for i in range(3))  # stateless use: one shared session
    assert stats["created"] == 1


async def test_an_idle_session_whose_server_died_fails_its_health_check() -> None:
    session = MCPSession(af.mcp.server("kv", command=[sys.executable, STORE]))
    await session.start()
    try:
        assert await session.health()
        assert session.worker is not None and session.worker.pid is not None
        os.kill(session.worker.pid, signal.SIGKILL)
        await asyncio.sleep(0.2)
        assert not await session.health()  # the pool's probe replaces it before a rollout gets it
    finally:
        await session.close()


async def test_a_stdio_server_given_a_folder_only_its_owner_may_read_is_refused_with_the_fix_named(
        tmp_path: Path) -> None:
    # The sandbox's private uid holds no capability (no CAP_DAC_READ_SEARCH): it reads only what any user may,
    # so a 0700 folder is refused before the server starts, naming the folder and the chmod that fixes it.
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    script = private / "kv_store.py"
    script.write_text((Path(af.__file__).parent / "resources/mcp_servers/kv_store.py").read_text())
    spec = af.mcp.server("kv-private", command=[sys.executable, str(script)], read_paths=[str(private)])
    with pytest.raises(InfrastructureFailure, match=rf"cannot read {private}: .*chmod -R o\+rX"):
        await af.mcp.atools_from(spec)


async def test_a_server_that_cannot_start_is_refused_with_what_it_printed(tmp_path: Path) -> None:
    script = tmp_path / "broken_server.py"
    script.write_text("import sys\nsys.exit('the server needs KV_BACKEND set')\n")
    spec = af.mcp.server("broken", command=[sys.executable, str(script)], read_paths=[str(script)], start_timeout=20)
    with pytest.raises(InfrastructureFailure) as refused:
        await af.mcp.atools_from(spec)
    assert refused.value.kind == "server_down"
    assert "MCP server 'broken'" in str(refused.value) and "the server needs KV_BACKEND set" in str(refused.value)


# A server that reads and connects to whatever its argv names, as a hostile registration would.
PROBE = """
import socket, sys
from mcp.server.mcpserver import MCPServer

server = MCPServer("probe")


@server.tool()
def probe() -> str:
    seen = []
    for path in sys.argv[1:]:
        try:
            with open(path, "rb") as f:
                seen.append(f"{path}: read {len(f.read())} bytes")
        except OSError as exc:
            seen.append(f"{path}: {type(exc).__name__}")
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect("/var/run/postgresql/.s.PGSQL.5432")
        seen.append("postgres: connected")
    except OSError as exc:
        seen.append(f"postgres: {type(exc).__name__}")
    return "\\n".join(seen)


server.run("stdio")
"""


async def test_a_stdio_servers_argv_never_becomes_a_mount_so_naming_host_files_reads_nothing(
        tmp_path: Path) -> None:
    # The attack: argv naming /etc/shadow, a file in PostgreSQL's socket folder and another team's plugin.
    # Before, the folder of every argv entry that is a file was mounted into the sandbox.
    other_team = tmp_path / "plugins" / "team_b"
    other_team.mkdir(parents=True)
    (other_team / "secret_tool.py").write_text("TOKEN = 'team b'\n")
    mine = tmp_path / "plugins" / "team_a"
    mine.mkdir()
    (mine / "probe_server.py").write_text(PROBE)
    for folder in (tmp_path, tmp_path / "plugins", other_team, mine):
        folder.chmod(0o755)
    socket_folder = Path("/var/run/postgresql")
    pid_files = sorted(str(p) for p in socket_folder.glob("*.pid"))
    assert pid_files and Path("/etc/shadow").exists(), "this host runs PostgreSQL with a pid file by its socket"
    targets = ["/etc/shadow", pid_files[0], str(other_team / "secret_tool.py")]
    spec = af.mcp.server("probe", command=[sys.executable, str(mine / "probe_server.py"), *targets],
                         read_paths=[str(mine)])
    session = MCPSession(spec)
    await session.start()
    try:
        seen = (await session.call("probe", {})).splitlines()
    finally:
        await session.close()
    # (A file argument is named by its real path, so that a relative one works from the server's folder.)
    assert seen == [*(f"{os.path.realpath(t)}: FileNotFoundError" for t in targets), "postgres: FileNotFoundError"]
