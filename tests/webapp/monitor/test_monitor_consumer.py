"""The job websocket, driven through the real ASGI application (session auth, origin check, routing) with
``WebsocketCommunicator``, on the real PostgreSQL and Redis channel layer."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connection

from trainer.events import metrics_event, status_event

# Each test takes seconds; a socket whose consumer never ends fails its test in two minutes, not ten.
pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

ORIGIN = (b"origin", b"http://localhost")
HOST = (b"host", b"localhost")


def application() -> Any:
    from webapp.asgi import application

    return application


def communicator(job_id: int, headers: list[tuple[bytes, bytes]], after: int | None = None) -> WebsocketCommunicator:
    path = f"/ws/jobs/{job_id}/" + ("" if after is None else f"?after={after}")
    return WebsocketCommunicator(application(), path, headers=[HOST, ORIGIN, *headers])


async def client_leaves(comm: WebsocketCommunicator) -> None:
    """What a browser does after the server's close frame; the consumer must then end within seconds."""
    await comm.send_input({"type": "websocket.disconnect", "code": 1000})
    done, _ = await asyncio.wait({comm.future}, timeout=15)
    assert done, "the consumer did not end within 15 s of its client leaving"


async def refused_with(comm: WebsocketCommunicator) -> tuple[int, str]:
    """Connect, read the error and the close; the client then leaves. Returns (close code, message)."""
    connected, _ = await comm.connect()
    assert connected, "the consumer accepts before closing so that the browser sees the close code"
    error = await comm.receive_json_from()
    closed = await comm.receive_output()
    assert closed["type"] == "websocket.close"
    await client_leaves(comm)
    return closed["code"], error["message"]


async def append(job_id: int, events: list[dict[str, Any]]) -> None:
    from webapp.monitor.events import append_events

    await asyncio.wait_for(database_sync_to_async(append_events)(job_id, events), timeout=15)


def metrics(step: int) -> dict[str, Any]:
    return metrics_event(step, {"reward_mean": step / 10})


async def receive_until_live(comm: WebsocketCommunicator) -> tuple[dict[str, Any], list[dict[str, Any]], int]:
    """Read ``hello``, the history pages and ``live``; return (hello, history events, last_seq)."""
    hello = await comm.receive_json_from()
    assert hello["type"] == "hello", hello
    history: list[dict[str, Any]] = []
    while True:
        message = await comm.receive_json_from(timeout=5)
        if message["type"] == "live":
            return hello, history, message["last_seq"]
        assert message["type"] == "events", message
        history.extend(message["events"])


async def receive_events(comm: WebsocketCommunicator, count: int, timeout: float = 10) -> list[dict[str, Any]]:
    received: list[dict[str, Any]] = []
    while len(received) < count:
        message = await comm.receive_json_from(timeout=timeout)
        assert message["type"] == "events", message
        received.extend(message["events"])
    return received


async def test_an_anonymous_socket_is_closed_with_code_4401(alice_job: Any) -> None:
    code, message = await refused_with(communicator(alice_job.pk, []))
    assert code == 4401
    assert "sign in" in message


async def test_a_socket_for_a_job_of_another_team_is_closed_with_code_4403(alice_job: Any, bob_cookie: Any) -> None:
    cookie = bob_cookie
    code, message = await refused_with(communicator(alice_job.pk, [cookie]))
    assert code == 4403
    assert f"#{alice_job.pk}" in message


async def test_a_socket_for_a_missing_job_gets_the_same_code_as_a_foreign_one(alice_cookie: Any) -> None:
    cookie = alice_cookie
    code, _ = await refused_with(communicator(987654, [cookie]))
    assert code == 4403


async def test_a_socket_with_a_malformed_sequence_number_is_closed_with_code_4400(alice_job: Any,
                                                                                   alice_cookie: Any) -> None:
    cookie = alice_cookie
    comm = WebsocketCommunicator(application(), f"/ws/jobs/{alice_job.pk}/?after=-3", headers=[HOST, ORIGIN, cookie])
    code, message = await refused_with(comm)
    assert code == 4400
    assert "after='-3'" in message


async def test_a_socket_from_a_foreign_origin_is_rejected_at_the_handshake(alice_job: Any, alice_cookie: Any) -> None:
    cookie = alice_cookie
    comm = WebsocketCommunicator(application(), f"/ws/jobs/{alice_job.pk}/",
                                 headers=[(b"origin", b"http://evil.example"), cookie])
    connected, _ = await comm.connect()
    assert not connected
    await client_leaves(comm)


async def test_history_comes_first_then_live_events_with_no_gap_and_no_duplicate(alice_job: Any,
                                                                                 alice_cookie: Any) -> None:
    await append(alice_job.pk, [metrics(s) for s in range(1, 6)])
    cookie = alice_cookie
    comm = communicator(alice_job.pk, [cookie])
    assert (await comm.connect())[0]
    hello, history, last_seq = await receive_until_live(comm)
    assert hello["job"]["id"] == alice_job.pk
    assert [e["seq"] for e in history] == [1, 2, 3, 4, 5]
    assert [e["data"]["reward_mean"] for e in history] == [0.1, 0.2, 0.3, 0.4, 0.5]
    assert last_seq == 5

    await append(alice_job.pk, [metrics(6), metrics(7)])
    await append(alice_job.pk, [status_event(7, "succeeded")])
    live = await receive_events(comm, 3)
    assert [e["seq"] for e in live] == [6, 7, 8]
    assert live[-1]["type"] == "status"
    assert await comm.receive_nothing(timeout=0.3)
    await comm.disconnect()


async def test_a_reconnecting_client_resumes_after_the_sequence_number_it_has(alice_job: Any, alice_cookie: Any) -> None:
    cookie = alice_cookie
    await append(alice_job.pk, [metrics(s) for s in range(1, 5)])
    first = communicator(alice_job.pk, [cookie])
    assert (await first.connect())[0]
    _, history, last_seq = await receive_until_live(first)
    assert [e["seq"] for e in history] == [1, 2, 3, 4]
    assert last_seq == 4
    await first.disconnect()

    # Events the job emits while the browser is away are not lost: the next socket starts from the database.
    await append(alice_job.pk, [metrics(s) for s in range(5, 9)])
    again = communicator(alice_job.pk, [cookie], after=last_seq)
    assert (await again.connect())[0]
    hello, resumed, last_seq = await receive_until_live(again)
    assert hello["after"] == 4
    assert [e["seq"] for e in resumed] == [5, 6, 7, 8]
    assert last_seq == 8
    await append(alice_job.pk, [metrics(9)])
    assert [e["seq"] for e in await receive_events(again, 1)] == [9]
    await again.disconnect()


async def test_a_long_history_arrives_in_pages_in_order(alice_job: Any, alice_cookie: Any) -> None:
    from webapp.jobs.consumers import HISTORY_PAGE

    total = HISTORY_PAGE * 2 + 7
    await append(alice_job.pk, [metrics(s) for s in range(total)])
    cookie = alice_cookie
    comm = communicator(alice_job.pk, [cookie], after=3)
    assert (await comm.connect())[0]
    _, history, last_seq = await receive_until_live(comm)
    assert [e["seq"] for e in history] == list(range(4, total + 1))
    assert last_seq == total
    await comm.disconnect()


async def test_an_announcement_that_was_never_heard_is_filled_in_from_the_database(alice_job: Any,
                                                                                  alice_cookie: Any) -> None:
    cookie = alice_cookie
    comm = communicator(alice_job.pk, [cookie])
    assert (await comm.connect())[0]
    await receive_until_live(comm)

    def store_silently() -> None:
        # Stored and committed, but its announcement lost (Redis blipped in the writer).
        from webapp.monitor import events

        original = events.publish
        events.publish = lambda job_id, messages: None
        try:
            events.append_events(alice_job.pk, [metrics(1), metrics(2)])
        finally:
            events.publish = original

    await asyncio.wait_for(database_sync_to_async(store_silently)(), timeout=15)
    assert await comm.receive_nothing(timeout=0.3)
    await append(alice_job.pk, [metrics(3)])
    received = await receive_events(comm, 3)
    assert [e["seq"] for e in received] == [1, 2, 3]
    await comm.disconnect()


async def test_events_arrive_once_and_in_order_under_a_burst_from_concurrent_writers(alice_job: Any,
                                                                                    alice_cookie: Any) -> None:
    """Four writers (the worker's sink, status changes from the web) store small batches as fast as they
    can while a client connects in the middle of the burst: it must see every seq exactly once, in order."""
    from webapp.monitor.events import append_events

    writers, batches = 4, 40

    def write(w: int) -> None:
        try:
            for b in range(batches):
                append_events(alice_job.pk, [metrics(w * 1000 + b * 10 + i) for i in range(1 + (b % 3))])
        finally:
            connection.close()

    total = writers * sum(1 + (b % 3) for b in range(batches))
    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    await asyncio.sleep(0.05)
    cookie = alice_cookie
    comm = communicator(alice_job.pk, [cookie])
    assert (await comm.connect())[0]
    _, history, _ = await receive_until_live(comm)
    seen = [e["seq"] for e in history]
    while len(seen) < total:
        message = await comm.receive_json_from(timeout=15)
        assert message["type"] == "events"
        seen.extend(e["seq"] for e in message["events"])
    for t in threads:
        await asyncio.wait_for(asyncio.to_thread(t.join), timeout=60)
    assert seen == list(range(1, total + 1))
    assert await comm.receive_nothing(timeout=0.5)
    await comm.disconnect()


async def test_the_socket_tells_a_client_that_sends_to_it_to_use_the_page_instead(alice_job: Any,
                                                                                 alice_cookie: Any) -> None:
    cookie = alice_cookie
    comm = communicator(alice_job.pk, [cookie])
    assert (await comm.connect())[0]
    await receive_until_live(comm)
    await comm.send_json_to({"action": "cancel"})
    reply = await comm.receive_json_from()
    assert reply["type"] == "error" and "buttons" in reply["message"]
    await comm.disconnect()


@pytest.mark.slow
async def test_an_idle_socket_stays_open_past_the_channel_layers_poll_interval(alice_job: Any,
                                                                              alice_cookie: Any) -> None:
    """channels-redis polls Redis with a 5 s blocking pop; with redis-py's default 5 s read timeout an idle
    consumer crashed (close 1011) every 5 s. A quiet job's dashboard must stay connected."""
    comm = communicator(alice_job.pk, [alice_cookie])
    assert (await comm.connect())[0]
    await receive_until_live(comm)
    assert await comm.receive_nothing(timeout=7.5, interval=0.5)
    await append(alice_job.pk, [metrics(1)])
    assert [e["seq"] for e in await receive_events(comm, 1)] == [1]
    await comm.disconnect()
