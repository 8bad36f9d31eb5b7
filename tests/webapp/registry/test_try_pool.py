"""One team's looping "try it" calls never time out another team's (issue 28: two looping tries from one
user made another team's try return 504).

A real ``try`` worker with the pool's concurrency runs real looping plugin code; the web side is the Django
test client, with a short ``AGENTFLY_TRY_TIMEOUT`` so alice's loops time out for her as they did in the attack.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from tests.webapp.factories import ready_entry
from tests.webapp.helpers import PASSWORD, Worker, wait_for, worker_env
from webapp.accounts.models import Team
from webapp.registry.tryslots import _redis, slot_keys

# The worker's hard timeout of a try child: long enough that alice's loops are certainly still running when
# bob's call (a child of its own to start, on a machine her two loops keep busy) has its answer. On 2 cores
# her two loops take both, and bob's child once needed about 14 s of wall time to start and answer.
CHILD_TIMEOUT = 30.0


@pytest.fixture
def try_worker(transactional_db: None, runs_dir: Path, tmp_path: Path) -> Iterator[Worker]:
    """A worker on the ``try`` queue alone, as many processes as the pool has places (3 here), and the only one
    taking from it: a worker already running (the session's on ``cpu,try``, started by an earlier test) stops
    consuming ``try`` meanwhile, or it would run some of these calls under its own timeouts and slots."""
    from webapp.celery import app

    others = [name for reply in app.control.ping(timeout=1.0) for name in reply]
    if others:
        app.control.cancel_consumer("try", destination=others, reply=True)
    env = {**worker_env(runs_dir), "AGENTFLY_CHILD_TIMEOUT": str(CHILD_TIMEOUT)}
    worker = Worker("try", env, tmp_path / "try-worker.log", concurrency=3)
    try:
        worker.wait_ready()
        yield worker
    finally:
        worker.stop()
        if others:
            app.control.add_consumer("try", destination=others, reply=True)


def api_for(user: Any) -> APIClient:
    api = APIClient()
    api.force_authenticate(user)
    return api


def try_it(user: Any, entry: Any, arguments: dict[str, Any]) -> Any:
    return api_for(user).post(f"/api/registry/{entry.pk}/try/", {"arguments": arguments}, format="json")


@pytest.mark.slow
def test_one_teams_looping_tries_never_time_out_another_teams_try(
        try_worker: Worker, alice: Any, team_a: Team, bob: Any, team_b: Team, settings: Any) -> None:
    settings.AGENTFLY_TRY_POOL = 3
    settings.AGENTFLY_TRY_TEAM_CONCURRENCY = 2
    settings.AGENTFLY_TRY_CONCURRENCY = 2
    settings.AGENTFLY_CHILD_TIMEOUT = child_timeout = CHILD_TIMEOUT  # the worker's (its slots' lease too)
    spin = ready_entry(team_a, "tool", "looping_tools:spin", "spin")
    echo = ready_entry(team_b, "tool", "looping_tools:echo", "echo")
    carol = get_user_model().objects.create_user("carol", password=PASSWORD)
    team_a.add_member(carol)

    # A first call warms the worker's processes: a call still PENDING when its wait ends is revoked and its
    # place given back (it will never run), which is not what this test is about.
    settings.AGENTFLY_TRY_TIMEOUT = 60.0
    assert try_it(bob, echo, {"text": "warm"}).status_code == 200
    # alice stops waiting long before her loops are killed, and late enough that each loop has started in its
    # own child, on a worker process the warm-up may not have touched (it took over 3 s on a loaded machine).
    settings.AGENTFLY_TRY_TIMEOUT = 8.0

    # alice's two loops: each request gives up after 8 s (504), but both loops go on running on the worker.
    for _ in range(2):
        assert try_it(alice, spin, {}).status_code == 504
    # Her third is refused, naming the per-user limit, while the first two still run.
    response = try_it(alice, spin, {})
    assert response.status_code == 429 and "AGENTFLY_TRY_CONCURRENCY=2" in response.json()["detail"]
    # Her teammate's is refused by the team's limit: one team's share of the pool is full.
    response = try_it(carol, spin, {})
    assert response.status_code == 429 and "AGENTFLY_TRY_TEAM_CONCURRENCY=2" in response.json()["detail"]
    # Another team's call runs beside the loops (given the usual time to answer: a child takes a moment to start).
    settings.AGENTFLY_TRY_TIMEOUT = 60.0
    response = try_it(bob, echo, {"text": "still here"})
    assert response.status_code == 200, response.content
    assert response.json()["observation"] == "still here" and not response.json()["error"]
    # It did not wait for them: alice's loops were still running when bob got his answer.
    assert _redis().zcard(slot_keys(alice.pk, team_a.pk)[2]) == 2

    # The loops are killed at the hard timeout, and their places come back.
    wait_for(lambda: _redis().zcard(slot_keys(alice.pk, team_a.pk)[2]) == 0, child_timeout + 30,
             "the worker to stop alice's loops and give back her places")
    response = try_it(alice, ready_entry(team_a, "tool", "looping_tools:echo", "echo"), {"text": "again"})
    assert response.status_code == 200 and response.json()["observation"] == "again"
