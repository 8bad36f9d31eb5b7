"""Request bodies are limited before they are read: ``AGENTFLY_MAX_BODY_BYTES``.

Django buffers a whole request body (``DATA_UPLOAD_MAX_MEMORY_SIZE`` caps only what a form parser keeps, not
what the ASGI handler reads first), so an anonymous 400 MB POST to the sign-in page was read in full before
the CSRF check refused it. ``BodyLimitMiddleware`` wraps the HTTP application in ``webapp.asgi``: a request
whose ``Content-Length`` is over the limit is answered 413 without a byte of its body being read, and a
chunked or streamed body is counted as it arrives and refused the moment it passes the limit (Django then
sees the client as gone, and the 413 goes out instead of its answer).

Daphne reads a body completely before it calls the application, so under Daphne the same limit must also
hold while the body arrives: ``webapp.serve`` starts Daphne with a request class that does that, and is how
the compose stack and the tests run the server.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def max_body_bytes() -> int:
    from django.conf import settings

    return int(settings.AGENTFLY_MAX_BODY_BYTES)


def refusal(limit: int) -> bytes:
    """The 413 answer's text: what was refused, the limit, and the setting that sets it."""
    return (f"Request body too large: this server accepts at most {limit} bytes in one request "
            f"(AGENTFLY_MAX_BODY_BYTES={limit}); send less, or ask the operator to raise the setting.\n").encode()


def declared_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The ``Content-Length`` a request declares, None when it declares none or one that is not a number."""
    for name, value in headers:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server refuses a malformed length itself
    return None


async def send_413(send: Send, limit: int) -> None:
    body = refusal(limit)
    await send({"type": "http.response.start", "status": 413, "headers": [
        (b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class BodyLimitMiddleware:
    """ASGI middleware: refuse (413) a body over ``AGENTFLY_MAX_BODY_BYTES`` before the application buffers it."""

    def __init__(self, app: ASGIApp, limit: int | None = None) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit if self.limit is not None else max_body_bytes()
        declared = declared_length(scope.get("headers", []))
        if declared is not None and declared > limit:
            await send_413(send, limit)
            return
        received, refused, started = 0, False, False

        async def counted() -> Message:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # The application sees a client that went away (Django stops reading with RequestAborted);
                    # the 413 below is the answer.
                    refused = True
                    return {"type": "http.disconnect"}
            return message

        async def guarded(message: Message) -> None:
            nonlocal started
            if refused and not started:
                return  # an answer to a request the application never fully got
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, counted, guarded)
        if refused and not started:
            await send_413(send, limit)
