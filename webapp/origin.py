"""The websocket handshake's origin check: exact scheme, host and port.

A websocket is not covered by CSRF protection, so a page on another origin could open one with the user's
session cookie. Channels' ``AllowedHostsOriginValidator`` compares only the origin's host name with
``ALLOWED_HOSTS``: a page served by any other port or scheme of an allowed host (another service on the same
machine, plain http beside https) passed. Here the ``Origin`` must be the site's own origin, the scheme, host
and port the browser used to reach it (the ``Host`` header, which must itself be allowed, and ``ws``/``wss``,
or ``X-Forwarded-Proto`` behind ``AGENTFLY_NUM_PROXIES`` proxies), or one listed in ``CSRF_TRUSTED_ORIGINS``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

from agentfly import urls

# A channel-layer alias no setting defines: channels then runs a consumer with no channel layer at all, so a
# refused socket never holds a Redis connection in a blocking receive (and ends as soon as its client goes).
NO_CHANNEL_LAYER = "none (refused)"


class Denier(WebsocketDenier):
    """Channels' handshake refusal, without the channel-layer subscription every consumer otherwise makes."""

    channel_layer_alias = NO_CHANNEL_LAYER


def _origin_tuple(scheme: str, netloc: str) -> tuple[str, str, int] | None:
    try:  # the one URL parser (userinfo refused, IP literals normalised, the scheme's port filled in)
        return urls.parse(f"{scheme}://{netloc}", what="origin").origin
    except urls.URLRefused:
        return None


def site_origin(scope: dict[str, Any]) -> tuple[str, str, int] | None:
    """The origin the browser reached this server at, or None when the Host header is missing or not allowed."""
    headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope.get("headers", [])}
    host = headers.get("host")
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:  # Django's own rule for a development server
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    if not host or not validate_host(split_domain_port(host)[0], allowed):
        return None
    scheme = "https" if scope.get("scheme") in ("wss", "https") else "http"
    forwarded = headers.get("x-forwarded-proto")
    if settings.AGENTFLY_NUM_PROXIES > 0 and forwarded:  # only a configured proxy's word is taken
        scheme = forwarded.split(",")[0].strip().lower()
    return _origin_tuple(scheme, host)


def origin_allowed(scope: dict[str, Any]) -> bool:
    origin_header = next((v.decode("latin-1") for n, v in scope.get("headers", []) if n.lower() == b"origin"), None)
    if not origin_header:
        return False
    parts = urlsplit(origin_header)
    origin = _origin_tuple(parts.scheme.lower(), parts.netloc)
    if origin is None:
        return False
    trusted = set()
    for entry in settings.CSRF_TRUSTED_ORIGINS:
        split = urlsplit(entry)
        if "*" not in split.netloc and (value := _origin_tuple(split.scheme.lower(), split.netloc)) is not None:
            trusted.add(value)
    return origin == site_origin(scope) or origin in trusted


class ExactOriginValidator:
    """ASGI middleware for websockets: refuse the handshake unless ``origin_allowed``."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket" and not origin_allowed(scope):
            denier = Denier()
            return await denier(scope, receive, send)
        return await self.application(scope, receive, send)
