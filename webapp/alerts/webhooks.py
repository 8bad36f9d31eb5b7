"""Webhook URLs a team may give, and the one POST that delivers an alert to one.

A webhook is sent by the server, so its URL could aim the server at its own network: a host that resolves to
a loopback, private, link-local, shared, reserved or unspecified address is refused (checked when the rule is
saved, and again at each delivery, since DNS can change) unless the operator names the host in
``AGENTFLY_ALERT_ALLOWED_HOSTS``. The POST connects to the very address that was checked (the name is never
resolved twice), follows no redirect, and waits at most ``TIMEOUT_S``.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import socket
import ssl
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

TIMEOUT_S = 5.0


class WebhookRefused(ValueError):
    """The URL may not be used; the message says why and which setting would allow it."""


class DeliveryFailed(Exception):
    """The receiver could not be reached or did not answer 2xx; worth another try."""


def _internal(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    return not ip.is_global or ip.is_multicast


def check_webhook_url(url: str) -> tuple[str, str, int, str]:
    """``(scheme, host, port, address)`` to deliver to; WebhookRefused names what is wrong and the fix."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise WebhookRefused(f"{url[:100]!r} is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or len(url) > 500:
        raise WebhookRefused(f"{url[:100]!r} is not an http(s) URL; give e.g. https://hooks.example.org/agentfly")
    if parts.username or parts.password:
        raise WebhookRefused("put no user or password in the webhook URL; use a secret path or query instead")
    host = parts.hostname
    try:
        addresses = sorted({str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)})
    except (OSError, UnicodeError) as exc:
        raise WebhookRefused(f"{host!r} does not resolve ({exc})") from None
    internal = [a for a in addresses if _internal(a)]
    if internal and host not in settings.AGENTFLY_ALERT_ALLOWED_HOSTS:
        raise WebhookRefused(f"{host!r} resolves to an internal address ({', '.join(internal)}); webhooks go to "
                             "public hosts only, unless the operator adds the host to AGENTFLY_ALERT_ALLOWED_HOSTS")
    return parts.scheme, host, port, addresses[0]


class _PinnedHTTPS(http.client.HTTPSConnection):
    """HTTPS to the checked address, with the certificate checked against the URL's host name."""

    def __init__(self, host: str, address: str, port: int, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._address = address

    def connect(self) -> None:
        raw = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(raw, server_hostname=self.host)  # type: ignore[attr-defined]


def post_json(url: str, body: dict[str, Any]) -> int:
    """POST ``body`` to ``url`` (checked again now); its status, or DeliveryFailed / WebhookRefused."""
    scheme, host, port, address = check_webhook_url(url)
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    conn: http.client.HTTPConnection = (_PinnedHTTPS(host, address, port, TIMEOUT_S) if scheme == "https"
                                        else http.client.HTTPConnection(address, port, timeout=TIMEOUT_S))
    try:
        conn.request("POST", target, body=json.dumps(body).encode(),
                     headers={"Host": host if port in (80, 443) else f"{host}:{port}",
                              "Content-Type": "application/json", "User-Agent": "AgentFly-alerts"})
        status = conn.getresponse().status
    except (OSError, http.client.HTTPException) as exc:
        raise DeliveryFailed(f"{host}:{port} could not be reached: {exc}") from None
    finally:
        conn.close()
    if not 200 <= status < 300:
        raise DeliveryFailed(f"{host}:{port} answered HTTP {status}")
    return status
