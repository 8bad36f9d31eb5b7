"""Endpoint URLs, parsed once and compared as what they are: the one place AgentFly reads a server's URL.

A URL is never matched by its text. ``parse`` splits it into an ``Endpoint`` (scheme, host, port, path), and
refuses what a client and a check could read differently: userinfo (``http://a@b/``: a prefix check reads
host ``a``, the client connects to ``b``), backslashes, control characters and ``.``/``..`` path segments
(plain or percent-encoded). Host names are lower-cased and IP literals normalised: an IPv4 address written as
one number, in octal or hex, or short (``2130706433``, ``0177.0.0.1``, ``127.1``: what the C resolver
accepts) becomes its dotted quad, and an IPv6 literal with an IPv4 address inside (mapped ``::ffff:a.b.c.d``,
compatible ``::a.b.c.d``, NAT64, 6to4, Teredo) is checked as that IPv4 address too.

``Endpoint.within`` compares an endpoint with an allowlist entry as an origin (scheme, host and port equal)
and a path on a segment boundary (``/mcp`` allows ``/mcp`` and ``/mcp/x``, never ``/mcpx``).
``resolve`` looks the host up once and ``internal`` says which of its addresses are not public (loopback,
private, link-local, unspecified, reserved); whoever connects then connects to the address that was checked
(``pinned_backend``), so a name that resolves differently a second later (DNS rebinding) gains nothing.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_URL = 2000
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# What glibc's inet_aton takes as an IPv4 address besides a dotted quad: 1 to 4 parts, decimal, octal or hex.
_NUMERIC_HOST = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)(?:\.(?:0x[0-9a-f]*|[0-9]+)){0,3}\.?")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class URLRefused(ValueError):
    """The URL is malformed or names something it may not; the message says what and how to fix it."""


@dataclass(frozen=True)
class Endpoint:
    """A parsed http(s) URL: ``host`` lower-case (an IP literal normalised, without brackets), ``port``
    filled in from the scheme when the URL has none, ``path`` at least ``/``."""

    url: str
    scheme: str
    host: str
    port: int
    path: str

    @property
    def origin(self) -> tuple[str, str, int]:
        return self.scheme, self.host, self.port

    def within(self, allowed: Endpoint) -> bool:
        """Whether this endpoint is on ``allowed``'s origin and under its path, segment by segment."""
        if self.origin != allowed.origin:
            return False
        base = allowed.path.rstrip("/")
        return not base or self.path == base or self.path.startswith(base + "/")


def ip_literal(host: str) -> IPAddress | None:
    """The IP address ``host`` is written as (any form a resolver accepts), or None for a name."""
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return ipaddress.ip_address(text.split("%")[0])
    except ValueError:
        pass
    if _NUMERIC_HOST.fullmatch(text.lower()):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(text.rstrip(".")))
        except OSError:
            raise URLRefused(f"{host!r} is neither a host name nor an IP address") from None
    return None


def embedded_ipv4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, compatible, NAT64, 6to4, Teredo client), if any."""
    if isinstance(ip, ipaddress.IPv4Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if int(ip) >> 32 == 0 and int(ip) > 1:  # ::a.b.c.d (deprecated "IPv4-compatible"); ::1 and :: are not
        return ipaddress.IPv4Address(int(ip))
    return None


def is_internal(address: str | IPAddress) -> bool:
    """Whether ``address`` (or the IPv4 address inside it) is not a public unicast address: loopback,
    private, link-local, unspecified, shared, reserved or multicast."""
    ip = ipaddress.ip_address(address.split("%")[0]) if isinstance(address, str) else address
    inner = embedded_ipv4(ip)
    return any(not a.is_global or a.is_multicast for a in (ip, *([inner] if inner is not None else [])))


def normal_host(host: str) -> str:
    """``host`` as endpoints compare it: lower-case, an IP literal in its normal form (an IPv4-mapped IPv6
    address as its IPv4 address), without brackets."""
    ip = ip_literal(host)
    if ip is None:
        return host.lower().rstrip(".")
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)


def parse(url: Any, *, what: str = "url") -> Endpoint:
    """``url`` as an ``Endpoint``; ``URLRefused`` names what is wrong with it (``what`` names the field)."""
    example = "e.g. https://tools.example.org/mcp"
    if not isinstance(url, str) or not url:
        raise URLRefused(f"{what} must be an http(s) URL, {example}")
    if len(url) > MAX_URL:
        raise URLRefused(f"{what} is longer than {MAX_URL} characters")
    shown = url[:100]
    if any(c <= " " or c == "\x7f" or c == "\\" for c in url):
        raise URLRefused(f"{what} {shown!r} contains a space, a control character or a backslash; give a plain "
                         f"URL, {example}")
    try:
        parts = urlsplit(url)
        port = parts.port  # raises on a port that is not a number or out of range
    except ValueError:
        raise URLRefused(f"{what} {shown!r} is not a valid URL, {example}") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise URLRefused(f"{what} {shown!r} is not an http:// or https:// URL, {example}")
    if "@" in parts.netloc:
        raise URLRefused(f"{what} {shown!r} has a user name or password before its host (user@host); give the "
                         "URL without it, and credentials to the server some other way")
    if not parts.hostname:
        raise URLRefused(f"{what} {shown!r} names no host, {example}")
    segments = unquote(parts.path).split("/")
    if "." in segments or ".." in segments:
        raise URLRefused(f"{what} {shown!r} has a '.' or '..' segment in its path; give the path it means")
    return Endpoint(url=url, scheme=scheme, host=normal_host(parts.hostname), port=port or DEFAULT_PORTS[scheme],
                    path=parts.path or "/")


def resolve(endpoint: Endpoint) -> list[str]:
    """The addresses ``endpoint``'s host has now (an IP literal is its own); ``URLRefused`` when it has none."""
    try:
        infos = socket.getaddrinfo(endpoint.host, endpoint.port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise URLRefused(f"{endpoint.host!r} does not resolve ({exc}); check the URL's host name") from None
    return sorted({str(info[4][0]) for info in infos})


def pinned_backend(host: str, address: str) -> Any:
    """An httpcore network backend that connects to ``address`` whenever a client asks for ``host``: the
    client keeps the URL, the Host header, SNI and certificate checks of the name, and no second lookup
    happens between the check of ``address`` and the connection. Any other host is refused."""
    import httpcore2  # the MCP SDK's HTTP stack; imported here so that importing agentfly does not need it

    class PinnedBackend(httpcore2.AsyncNetworkBackend):
        def __init__(self) -> None:
            self.inner = httpcore2.AnyIOBackend()

        async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                              local_address: str | None = None, socket_options: Any = None) -> Any:
            if normal_host(host) != host_normal:
                raise httpcore2.ConnectError(f"{host!r} is not the checked host {host_normal!r}")
            return await self.inner.connect_tcp(address, port, timeout=timeout, local_address=local_address,
                                                socket_options=socket_options)

        async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                      socket_options: Any = None) -> Any:
            raise httpcore2.ConnectError("a pinned client connects over TCP only")

        async def sleep(self, seconds: float) -> None:
            await self.inner.sleep(seconds)

    host_normal = normal_host(host)
    return PinnedBackend()
