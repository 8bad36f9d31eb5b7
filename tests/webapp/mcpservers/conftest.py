"""Each test starts with an empty MCP inspection pool: a registration in a test without a committed
transaction takes a place that no inspection will give back (its task is never sent), and the place would
otherwise be held, in the real Redis, into the next tests until it expires."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


def _clear_inspection_slots() -> None:
    from django.conf import settings

    from webapp.registry.tryslots import _redis

    client = _redis()
    stale = list(client.scan_iter(f"{settings.REDIS_PREFIX}agentfly:mcp-inspections:*"))
    if stale:
        client.delete(*stale)


@pytest.fixture(autouse=True)
def empty_inspection_pool() -> Iterator[None]:
    _clear_inspection_slots()
    yield
    _clear_inspection_slots()
