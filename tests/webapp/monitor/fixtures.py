"""Fixtures for the live-monitoring tests: a job of alice's team, session cookies for websockets, and a
channel layer of their own on the real Redis (settings, the test database, alice and bob, Daphne and the
browser come from ``tests/webapp/fixtures.py``).

Each test gets a channel-layer prefix of its own, so events of another test (same job ids, same group
names) cannot cross-talk with its socket.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def private_channel_layer(request: pytest.FixtureRequest, settings: Any) -> Iterator[str]:
    """A channel-layer prefix of this test's own (layers are cached per process, so reset around it); the
    Daphne a browser test starts is given the same prefix through ``CHANNEL_LAYER_PREFIX``.

    A test that runs a job on the session's Celery worker shares the worker's prefix instead: the worker
    publishes the job's events, and the page must hear them.
    """
    from channels.layers import channel_layers

    config = settings.CHANNEL_LAYERS["default"]["CONFIG"]
    prefix = config.get("prefix", "asgi")
    if "worker" not in request.fixturenames:
        prefix = f"monitor-test-{uuid.uuid4().hex[:8]}"
        settings.CHANNEL_LAYERS = {"default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {**config, "hosts": [dict(config["hosts"][0])], "prefix": prefix,
                       "capacity": 5000, "expiry": 30},
        }}
    channel_layers.backends.clear()
    yield prefix
    channel_layers.backends.clear()


@pytest.fixture
def alice_job(alice: Any) -> Any:
    """A running job of alice's team (created directly: these tests are about its events, not its run)."""
    from webapp.accounts.models import Team
    from webapp.jobs.models import Status, TrainingJob

    team = Team.objects.of(alice).get()
    return TrainingJob.objects.create(team=team, created_by=alice, name="tiny arithmetic", status=Status.RUNNING,
                                      config={"steps": 10})


def _session_cookie(user: Any) -> tuple[bytes, bytes]:
    """The ``cookie`` header of a browser signed in as ``user``."""
    from django.conf import settings
    from django.test import Client

    client = Client()
    client.force_login(user)
    value = client.cookies[settings.SESSION_COOKIE_NAME].value
    return (b"cookie", f"{settings.SESSION_COOKIE_NAME}={value}".encode())


@pytest.fixture
def alice_cookie(alice: Any) -> tuple[bytes, bytes]:
    return _session_cookie(alice)


@pytest.fixture
def bob_cookie(bob: Any) -> tuple[bytes, bytes]:
    return _session_cookie(bob)
