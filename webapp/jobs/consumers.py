"""The websocket a job's dashboard listens on: ``/ws/jobs/<id>/?after=<seq>``.

The consumer authenticates (session, through ``AuthMiddlewareStack``), authorises (the job belongs to one
of the user's teams), joins the job's group and forwards stored events, in ``seq`` order, exactly once:

1. It joins ``job-<id>`` *before* reading history, so an event committed after the read is still heard.
2. It sends the stored events with ``seq > after`` from the database, in pages (``{"type": "events"}``) of
   at most ``MESSAGE_BUDGET_BYTES`` each (sized in bytes, not counted: Daphne drops a connection whose
   message passes 1 MiB), then ``{"type": "live", "last_seq": n}``. Sample events and any event over
   ``MAX_INLINE_EVENT_BYTES`` travel as stubs (``"stub": true``, no ``data``); the page fetches one by seq
   from ``events/<seq>.json`` when it shows it. A dashboard reads its history from ``series.json``
   (downsampled, with the ``last_seq`` it covers) and connects with ``?after=`` that seq, so the socket only
   carries what came later.
3. A group message announces a committed range ``first_seq..last_seq``. Events at or below the last sent
   ``seq`` are dropped (heard during the history read); a range that starts past ``last_seq + 1`` means
   an announcement was missed or overtaken (two writers publish independently), so the consumer reads the
   gap from the database instead of guessing. The database is the one source of truth; the group only
   says "there is more".

A client that reconnects passes the last ``seq`` it has as ``?after=`` and continues with no gap and no
duplicate. Close codes (the browser sees them in ``CloseEvent.code``):
``4400`` bad ``after``, ``4401`` not signed in, ``4403`` no such job among the user's teams' jobs (one code
for both, so a socket cannot probe which job ids exist).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from webapp.monitor.events import group_name, pages_by_size, wire_events_after
from webapp.origin import NO_CHANNEL_LAYER

CLOSE_BAD_REQUEST = 4400
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403

HISTORY_PAGE = 500


@database_sync_to_async
def _visible_job_summary(user: Any, job_id: int) -> dict[str, Any] | None:
    from webapp.jobs.models import TrainingJob

    job = TrainingJob.objects.visible_to(user).filter(pk=job_id).first()
    if job is None:
        return None
    return {**job.summary(), "name": job.name, "last_seq": job.last_seq}


@database_sync_to_async
def _stored_after(job_id: int, after_seq: int, limit: int) -> list[dict[str, Any]]:
    return wire_events_after(job_id, after_seq, limit=limit)


def parse_after(query_string: bytes | str) -> int:
    """The ``after`` query parameter: a non-negative integer, 0 when absent."""
    raw = query_string.decode("latin-1") if isinstance(query_string, bytes) else query_string
    values = parse_qs(raw).get("after", [])
    if not values or values[-1] == "":
        return 0
    value = values[-1]
    if not value.isdigit():
        raise ValueError(f"after={value!r} is not a sequence number; pass the last seq you have (0 for all)")
    return int(value)


class JobEventsConsumer(AsyncJsonWebsocketConsumer):
    """One socket per open dashboard (or compare-page series) of one job."""

    job_id: int
    group: str
    last_seq: int

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        # Who may watch is decided from the handshake's scope alone, before the consumer subscribes to the channel
        # layer: a refused socket (not signed in, another team's job, a bad ``after``) never holds a Redis
        # connection in a blocking receive, so sockets opened by anyone cost the server no Redis connection
        # until they are allowed, and a refused one ends as soon as its client goes.
        self.refusal: tuple[int, str] | None = None
        self.job: dict[str, Any] = {}
        try:
            self.refusal = await self._authorise(scope)
        finally:
            if self.refusal is not None:
                self.channel_layer_alias = NO_CHANNEL_LAYER
        await super().__call__(scope, receive, send)

    async def _authorise(self, scope: Any) -> tuple[int, str] | None:
        """None when the socket may watch its job (``job_id``, ``job``, ``last_seq`` are then set), else the
        close code and the reason the client is told."""
        user = scope.get("user")
        if user is None or not user.is_authenticated:
            return CLOSE_UNAUTHENTICATED, "sign in to watch a job"
        try:
            self.last_seq = parse_after(scope.get("query_string", b""))
        except ValueError as exc:
            return CLOSE_BAD_REQUEST, str(exc)
        self.job_id = int(scope["url_route"]["kwargs"]["job_id"])
        job = await _visible_job_summary(user, self.job_id)
        if job is None:
            return CLOSE_FORBIDDEN, f"job #{self.job_id} is not a job of your teams"
        self.job = job
        return None

    async def connect(self) -> None:
        self.group = ""
        if self.refusal is not None:
            await self._refuse(*self.refusal)
            return
        after = self.last_seq
        self.group = group_name(self.job_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.send_json({"type": "hello", "job": self.job, "after": after})
        await self._catch_up()
        await self.send_json({"type": "live", "last_seq": self.last_seq})

    async def _refuse(self, code: int, reason: str) -> None:
        # Accept first: a socket closed during the handshake reaches the browser as a bare 1006 with no code.
        await self.accept()
        await self.send_json({"type": "error", "code": code, "message": reason})
        await self.close(code=code)

    async def disconnect(self, code: int) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        # The socket is one-way; actions (cancel) go through POST with CSRF protection.
        await self.send_json({"type": "error", "code": CLOSE_BAD_REQUEST,
                              "message": "this socket only sends; use the page's buttons to act on the job"})

    async def _catch_up(self) -> None:
        """Send every stored event after ``last_seq``: read ``HISTORY_PAGE`` rows at a time, sent by size."""
        while True:
            rows = await _stored_after(self.job_id, self.last_seq, HISTORY_PAGE)
            if rows:
                await self._send_events(rows)
            if len(rows) < HISTORY_PAGE:
                return

    async def _send_events(self, events: list[dict[str, Any]], sizes: list[int] | None = None) -> None:
        for page in pages_by_size(events, sizes=sizes):
            self.last_seq = page[-1]["seq"]
            await self.send_json({"type": "events", "events": page})

    async def job_events(self, message: dict[str, Any]) -> None:
        """A ``job.events`` group message: the range ``first_seq..last_seq`` is committed."""
        last = int(message.get("last_seq", 0))
        if last <= self.last_seq:
            return  # already sent (read from history, or an overtaken announcement)
        first = int(message.get("first_seq", last))
        events = message.get("events")
        if first > self.last_seq + 1 or not isinstance(events, list):
            await self._catch_up()  # a gap, or an announcement without payload: the database has it all
            return
        sizes = message.get("sizes")
        keep = [i for i, e in enumerate(events) if e["seq"] > self.last_seq]
        if keep:
            fresh = [events[i] for i in keep]
            await self._send_events(fresh, [sizes[i] for i in keep] if isinstance(sizes, list) else None)
