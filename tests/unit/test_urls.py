"""Endpoint URLs are parsed, never prefix-matched: each bypass of a text comparison is refused or normalised
(``agentfly.urls``)."""

from __future__ import annotations

import pytest

from agentfly.urls import URLRefused, is_internal, parse


@pytest.mark.parametrize(("url", "named"), [
    ("http://127.0.0.1:8153@127.0.0.1:8154/steal", "user name or password"),
    ("http://user:pw@tools.example.org/mcp", "user name or password"),
    ("http://tools.example.org\\@127.0.0.1/mcp", "backslash"),
    ("http://tools.example.org/mcp/../admin", "'..' segment"),
    ("http://tools.example.org/mcp/%2e%2e/admin", "'..' segment"),
    ("http://tools.example.org/mcp\n", "control character"),
    ("file:///etc/passwd", "not an http:// or https:// URL"),
    ("http:///mcp", "names no host"),
    ("http://[::1", "not a valid URL"),
    ("http://a:99999/mcp", "not a valid URL"),
])
def test_a_url_a_client_and_a_check_could_read_differently_is_refused_naming_why(url: str, named: str) -> None:
    with pytest.raises(URLRefused, match=named):
        parse(url)


@pytest.mark.parametrize(("url", "host"), [
    ("http://[::ffff:127.0.0.1]:8154/", "127.0.0.1"),
    ("http://[::ffff:169.254.169.254]/latest", "169.254.169.254"),
    ("http://[::ffff:7f00:1]/", "127.0.0.1"),
    ("http://2130706433/", "127.0.0.1"),
    ("http://0177.0.0.1/", "127.0.0.1"),
    ("http://0x7f.1/", "127.0.0.1"),
    ("http://127.1/", "127.0.0.1"),
    ("http://LOCALHOST./", "localhost"),
])
def test_every_way_of_writing_an_address_becomes_the_one_it_means(url: str, host: str) -> None:
    assert parse(url).host == host


@pytest.mark.parametrize("address", [
    "127.0.0.1", "::1", "::ffff:127.0.0.1", "::ffff:169.254.169.254", "169.254.169.254", "10.0.0.5",
    "192.168.1.1", "172.16.0.1", "100.64.0.1", "0.0.0.0", "::", "fe80::1", "fc00::1",
    "64:ff9b::7f00:1",      # NAT64 of 127.0.0.1
    "2002:7f00:1::",        # 6to4 of 127.0.0.1
    "::127.0.0.1",          # IPv4-compatible
    "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo whose client is 127.0.0.1
])
def test_loopback_private_and_link_local_addresses_are_internal_in_every_form(address: str) -> None:
    assert is_internal(address)


@pytest.mark.parametrize("address", ["8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8"])
def test_a_public_address_is_not_internal(address: str) -> None:
    assert not is_internal(address)


@pytest.mark.parametrize(("url", "allowed"), [
    ("http://tools.example.org/mcp", True),
    ("http://tools.example.org:80/mcp/x", True),
    ("HTTP://Tools.Example.org/mcp?q=1", True),
    ("http://tools.example.org/mcpx", False),          # a prefix, not a segment
    ("http://tools.example.org/", False),
    ("https://tools.example.org/mcp", False),          # another scheme
    ("http://tools.example.org:8080/mcp", False),      # another port
    ("http://tools.example.org.evil.net/mcp", False),  # a host that starts like it
    ("http://tools.example.orgevil.net/mcp", False),
])
def test_an_allowlist_entry_allows_its_origin_and_paths_under_its_path_on_a_segment_boundary(
        url: str, allowed: bool) -> None:
    assert parse(url).within(parse("http://tools.example.org/mcp")) is allowed
    assert parse(url).within(parse("http://tools.example.org/mcp/")) is allowed


def test_an_entry_with_only_an_origin_allows_every_path_of_that_origin() -> None:
    entry = parse("https://tools.example.org")
    assert parse("https://tools.example.org/any/path").within(entry)
    assert not parse("https://tools.example.org:444/any").within(entry)
