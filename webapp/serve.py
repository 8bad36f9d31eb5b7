"""Run Daphne with ``AGENTFLY_MAX_BODY_BYTES`` held while a request body arrives.

    python -m webapp.serve -b 0.0.0.0 -p 8000 webapp.asgi:application

Takes Daphne's own arguments. Daphne (on Twisted) reads a request's whole body, to memory or a temporary file,
before it hands the request to the application, so an ASGI middleware alone sees a 400 MB body only once it
has all arrived and been queued in memory. Here Daphne's request class refuses it as soon as the headers
declare too long a body, or as soon as a chunked body passes the limit: a 413 goes out, the connection closes,
and nothing more is read. ``webapp.bodylimit.BodyLimitMiddleware`` applies the same limit to servers that
stream bodies to the application.
"""

from __future__ import annotations

import os
from typing import Any

from daphne import http_protocol, server
from daphne.cli import CommandLineInterface

from webapp.bodylimit import max_body_bytes, refusal


class LimitedWebRequest(http_protocol.WebRequest):
    """Daphne's request, refusing a body over the limit before it is stored."""

    _received = 0
    _refused = False

    def gotLength(self, length: int | None) -> None:  # Twisted's names, overridden
        if length is not None and length > max_body_bytes():
            self._refuse()
            return
        super().gotLength(length)

    def handleContentChunk(self, data: bytes) -> None:
        if self._refused:
            return
        self._received += len(data)
        if self._received > max_body_bytes():
            self._refuse()
            return
        super().handleContentChunk(data)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        if not self._refused:
            super().requestReceived(command, path, version)

    def _refuse(self) -> None:
        # Written straight to the transport: the request has not been handed to the application, and will not be.
        self._refused = True
        self.content = _Discard()
        body = refusal(max_body_bytes())
        self.channel.transport.write(
            b"HTTP/1.1 413 Content Too Large\r\nContent-Type: text/plain; charset=utf-8\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
        self.channel.transport.loseConnection()  # stops reading: the rest of the body is never received


class _Discard:
    """Where the refused request's body goes (nowhere)."""

    closed = True

    def write(self, data: bytes) -> None:
        pass

    def read(self, size: int = -1) -> bytes:
        return b""

    def seek(self, *args: Any) -> int:
        return 0

    def close(self) -> None:
        pass


class LimitedHTTPFactory(http_protocol.HTTPFactory):
    def buildProtocol(self, addr: Any) -> Any:
        protocol = super().buildProtocol(addr)
        protocol.requestFactory = LimitedWebRequest
        return protocol


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    server.HTTPFactory = LimitedHTTPFactory  # Daphne's Server builds its factory from this name
    CommandLineInterface.entrypoint()


if __name__ == "__main__":
    main()
