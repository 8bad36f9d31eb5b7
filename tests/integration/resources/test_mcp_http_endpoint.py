"""An HTTP MCP server is reached at the address that was checked, and a URL that reaches some other service
never brings that service's answer back in an error."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

import pytest

pytest.importorskip("mcp")

import agentfly as af
from agentfly.resources import InfrastructureFailure
from agentfly.resources.mcp import MCPSession
from tests.integration.resources.test_mcp_server_resource import http_server

__all__ = ["http_server"]
SECRET = "internal-token-5f2c9e"


@contextlib.contextmanager
def serving_a_secret() -> Iterator[tuple[int, list[str]]]:
    """A service on loopback that is no MCP server and answers every request with a secret; the Host header
    of each request it gets is recorded."""
    hosts: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            hosts.append(self.headers.get("Host", ""))
            body = json.dumps({"token": SECRET}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_DELETE = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield int(server.server_address[1]), hosts
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def internal_service() -> Iterator[tuple[int, list[str]]]:
    with serving_a_secret() as service:
        yield service


async def test_a_session_connects_to_the_checked_address_and_never_looks_the_name_up_again(
        internal_service: tuple[int, list[str]]) -> None:
    port, hosts = internal_service
    # ``.invalid`` never resolves (RFC 6761): the service hears from the session only if it connects to the
    # address given, while the request still names the host of the URL.
    session = MCPSession(af.mcp.server("kv", url=f"http://kv.rebinding.invalid:{port}/mcp", address="127.0.0.1",
                                       start_timeout=10))
    with pytest.raises(InfrastructureFailure):
        await session.start()
    assert hosts and set(hosts) == {f"kv.rebinding.invalid:{port}"}


async def test_a_session_to_a_real_server_at_its_checked_address_lists_its_tools(
        http_server: tuple[str, int, list[subprocess.Popen[bytes]]]) -> None:
    session = MCPSession(af.mcp.server("kv", url=http_server[0], address="127.0.0.1", start_timeout=20))
    await session.start()
    try:
        assert {"put", "get"} <= {t.name for t in session.tools}
    finally:
        await session.close()


async def test_an_http_endpoint_that_is_not_an_mcp_server_never_has_its_answer_in_the_error(
        internal_service: tuple[int, list[str]]) -> None:
    port, hosts = internal_service
    session = MCPSession(af.mcp.server("kv", url=f"http://127.0.0.1:{port}/steal", start_timeout=10))
    with pytest.raises(InfrastructureFailure) as failure:
        await session.start()
    assert hosts and SECRET not in str(failure.value)
    assert "not an MCP session" in str(failure.value) and "MCP endpoint" in str(failure.value)


def test_a_url_with_userinfo_is_refused_by_the_library_too() -> None:
    with pytest.raises(ValueError, match="user name or password"):
        af.mcp.server("kv", url="http://127.0.0.1:8153@127.0.0.1:8154/steal")
