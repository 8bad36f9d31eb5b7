"""Bodies over AGENTFLY_MAX_BODY_BYTES are refused before they are read (issue 28: a 400 MB POST to /login/).

Against a real Daphne server started on loopback the way compose starts it (``python -m webapp.serve``), and
through the ASGI application itself for servers that stream bodies.
"""

from __future__ import annotations

import socket
import threading
import urllib.request
from typing import Any

import pytest

from tests.webapp.helpers import Daphne

BIG = 400 * 1024 * 1024
CHUNK = b"x" * (1024 * 1024)


def peak_rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


def post_400_mb(port: int, chunked: bool) -> tuple[bytes, int]:
    """POST 400 MB to /login/ as an anonymous client; (the answer's first bytes, bytes sent)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    framing = b"Transfer-Encoding: chunked\r\n" if chunked else f"Content-Length: {BIG}\r\n".encode()
    sent = 0
    sock.sendall(b"POST /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: multipart/form-data; boundary=xyz\r\n" + framing + b"\r\n")

    def upload() -> None:
        nonlocal sent
        try:
            while sent < BIG:
                sock.sendall(b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK) if chunked else CHUNK)
                sent += len(CHUNK)
        except OSError:
            pass  # the server closed the connection: what it should do

    uploader = threading.Thread(target=upload, daemon=True)
    uploader.start()
    answer = sock.recv(4096)
    uploader.join(10)
    sock.close()
    return answer, sent


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_400_mb_anonymous_post_to_login_is_refused_at_once_without_growing_the_server(
        daphne: Daphne, chunked: bool) -> None:
    assert daphne.proc is not None
    assert urllib.request.urlopen(f"{daphne.url}/login/", timeout=10).status == 200  # warm: imports done
    before = peak_rss_kb(daphne.proc.pid)
    answers: list[int] = []

    def browse() -> None:
        for _ in range(3):
            answers.append(urllib.request.urlopen(f"{daphne.url}/login/", timeout=5).status)

    browser = threading.Thread(target=browse)
    browser.start()
    answer, sent = post_400_mb(daphne.port, chunked)
    browser.join(15)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"AGENTFLY_MAX_BODY_BYTES" in answer
    assert sent < BIG  # the server answered and stopped reading long before the end
    assert (peak_rss_kb(daphne.proc.pid) - before) < 50 * 1024
    assert answers == [200, 200, 200]  # the site kept answering meanwhile
    assert urllib.request.urlopen(f"{daphne.url}/login/", timeout=5).status == 200


def asgi_post(body_chunks: list[bytes], headers: list[tuple[bytes, bytes]]) -> tuple[int, bytes, int]:
    """POST through the ASGI application (no server); (status, body, chunks the application pulled)."""
    import asyncio

    from webapp.asgi import application

    pulled = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        if pulled < len(body_chunks):
            pulled += 1
            return {"type": "http.request", "body": body_chunks[pulled - 1], "more_body": pulled < len(body_chunks)}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/login/", "raw_path": b"/login/", "query_string": b"", "root_path": "",
             "headers": [(b"host", b"testserver"), *headers], "client": ("127.0.0.1", 1), "server": ("testserver", 80)}
    asyncio.run(asyncio.wait_for(application(scope, receive, send), 30))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], body, pulled


def test_the_asgi_application_refuses_a_streamed_body_once_it_passes_the_limit(db: None, settings: Any) -> None:
    settings.AGENTFLY_MAX_BODY_BYTES = 1000
    status, body, pulled = asgi_post([b"x" * 600] * 50, [(b"content-type", b"application/octet-stream")])
    assert status == 413 and b"AGENTFLY_MAX_BODY_BYTES=1000" in body
    assert pulled == 2  # the application stopped at the chunk that passed the limit
    status, body, pulled = asgi_post([b"x"], [(b"content-length", b"5000")])
    assert status == 413 and pulled == 0  # refused by its declared length, before any of it was read
