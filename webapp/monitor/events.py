"""Store a job's events with gap-free per-job sequence numbers, then announce them to ``job-<id>``.

One function, ``append_events``, serves every writer: the worker's sink (batches of metrics, samples,
resource stats, logs) and the web process's actions (status changes). Every event is made by the
constructors of ``trainer.events`` and stored as it is made (``normalise`` checks it, it never reshapes it). Numbers are reserved with a single
``UPDATE ... SET last_seq = last_seq + n`` on the job row, which takes the row's write lock in PostgreSQL and
the database write lock in SQLite, so concurrent writers get disjoint ranges without a separate sequence.
The announcement goes out only after the transaction commits: a listener that reacts by reading the
database always finds the rows it was told about.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from django.db import transaction
from django.db.models import F
from django.http import QueryDict

from trainer.events import jsonable
from webapp.monitor.models import EventType, JobEvent

log = logging.getLogger(__name__)

EVENT_TYPES = frozenset(EventType.values)

# Daphne refuses websocket messages over 1 MiB (its ``websocket_max_message_size`` default, autobahn's
# ``PayloadExceededError``). A page of events stays a quarter of that, so framing, a slower client's
# deflate or a bigger-than-measured key never brings it near the limit.
MESSAGE_BUDGET_BYTES = 256 * 1024
# An event bigger than this travels as a stub (its fields without ``data``, ``"stub": true``) and the page
# fetches it by seq when it shows it (``events/<seq>.json``). Sample events always do: their trajectories
# and token texts are large and only one step's are ever on screen.
MAX_INLINE_EVENT_BYTES = 64 * 1024


class EventError(ValueError):
    """An event that cannot be stored; the message names the bad field."""


def normalise(event: Mapping[str, Any]) -> dict[str, Any]:
    """Check an event (``trainer.events.Event``, as its constructors make it) and split it into the stored
    columns: ``type``, ``step``, ``time`` and its payload as ``data``. ``run`` is not stored: the job is the
    run. The payload is stored as it is, made JSON-safe for jsonb. Events may come from a training process
    the worker does not trust, so every field is checked and a bad one named."""
    if not isinstance(event, Mapping):
        raise EventError(f"an event must be a dict, got {type(event).__name__}")
    unknown = set(event) - {"type", "step", "time", "run", "data"}
    if unknown:
        raise EventError(f"an event has type, step, time, run and data (made by trainer.events), not {sorted(unknown)}")
    kind = event.get("type")
    if kind not in EVENT_TYPES:
        raise EventError(f"event type {kind!r} is not one of {sorted(EVENT_TYPES)}")
    step = event.get("step")
    if isinstance(step, float) and step.is_integer():
        step = int(step)
    if "step" in event and (isinstance(step, bool) or not isinstance(step, int)):
        raise EventError(f"event step must be an integer, got {step!r}")
    at = event.get("time")
    if "time" in event and (isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at)):
        raise EventError(f"event time must be a Unix timestamp, got {at!r}")
    payload = event.get("data")
    if "data" in event and not isinstance(payload, Mapping):
        raise EventError(f"event data must be a dict (the payload of a {kind} event), got {type(payload).__name__}")
    missing = [k for k in ("step", "time", "data") if k not in event]
    if missing:
        raise EventError(f"an event has no {', '.join(missing)}: make it with a constructor of trainer.events "
                         f"(e.g. {kind}_event)")
    # jsonb refuses NaN, infinities and the NUL character: a sample's text keeps a NUL as U+FFFD.
    return {"type": kind, "step": step, "time": float(at),  # type: ignore[arg-type]  # a number, above
            "data": jsonable(payload, nul="\ufffd")}


def append_events(job_id: int, events: Iterable[Mapping[str, Any]]) -> list[JobEvent]:
    """Store ``events`` for the job under the next sequence numbers and announce them after commit."""
    # The job's model through the events' foreign key: the monitor app never imports the jobs app.
    TrainingJob: Any = JobEvent.job.field.related_model  # its model class, which this app does not import

    rows = [normalise(e) for e in events]
    if not rows:
        return []
    with transaction.atomic():
        updated = TrainingJob.objects.filter(pk=job_id).update(last_seq=F("last_seq") + len(rows))
        if not updated:  # the job was deleted; its events have nowhere to go
            return []
        last = TrainingJob.objects.values_list("last_seq", flat=True).get(pk=job_id)
        first = last - len(rows) + 1
        stored = JobEvent.objects.bulk_create(
            [JobEvent(job_id=job_id, seq=first + i, **row) for i, row in enumerate(rows)]
        )
        messages = [wire_message(e.as_message()) for e in stored]
        transaction.on_commit(lambda: publish(job_id, messages))
    return stored


def encoded_size(message: Mapping[str, Any]) -> int:
    """Bytes of ``message`` as ``send_json`` writes it (``json.dumps`` escapes non-ASCII, so chars = bytes)."""
    return len(json.dumps(message))


def stub(message: Mapping[str, Any], size: int) -> dict[str, Any]:
    """The event without its payload: enough to list it (seq, type, step, time) and fetch it later."""
    return {"seq": message["seq"], "type": message["type"], "step": message["step"], "time": message["time"],
            "data": None, "stub": True, "bytes": size}


def wire_message(message: dict[str, Any]) -> dict[str, Any]:
    """The event as a live page gets it: inline when small, a stub when it is a sample or too big."""
    if message["type"] == "samples":
        return stub(message, encoded_size(message))
    size = encoded_size(message)
    return message if size <= MAX_INLINE_EVENT_BYTES else stub(message, size)


def pages_by_size(messages: Iterable[dict[str, Any]], budget: int = MESSAGE_BUDGET_BYTES,
                  sizes: Iterable[int] | None = None) -> Iterator[list[dict[str, Any]]]:
    """Split ``messages`` (in order) into lists whose ``{"type": "events", "events": [...]}`` envelope encodes
    to at most ``budget`` bytes. Every message lands in exactly one page; a message that alone exceeds the
    budget is an error of the caller (``wire_message`` stubs those first). ``sizes``, when given, are the
    messages' ``encoded_size`` already measured (the publisher measures once for every listening socket)."""
    envelope = encoded_size({"type": "events", "events": []})
    page: list[dict[str, Any]] = []
    used = envelope
    known = iter(sizes) if sizes is not None else None
    for message in messages:
        size = (next(known) if known is not None else encoded_size(message)) + 2  # ", " between items
        if envelope + size > budget:
            raise ValueError(f"event #{message.get('seq')} alone is {size} bytes, over the page budget of "
                             f"{budget}; send it through wire_message() so it travels as a stub")
        if page and used + size > budget:
            yield page
            page, used = [], envelope
        page.append(message)
        used += size
    if page:
        yield page


def group_name(job_id: int) -> str:
    return f"job-{job_id}"


def publish(job_id: int, messages: list[dict[str, Any]]) -> None:
    """Announce stored events to the job's Channels group. The database already has them, so a failure to
    publish (Redis down) only delays what a live page shows; it must not fail the job."""
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(
            group_name(job_id),
            {"type": "job.events", "job_id": job_id, "first_seq": messages[0]["seq"],
             "last_seq": messages[-1]["seq"], "events": messages, "sizes": [encoded_size(m) for m in messages]},
        )
    except Exception:
        log.warning("could not publish events %s..%s of job %s", messages[0]["seq"], messages[-1]["seq"], job_id,
                    exc_info=True)


def requested_types(query: QueryDict) -> list[str]:
    """The event types a request asks for: ``types=metrics,status`` (comma-separated or repeated). ``type=``
    is the deprecated spelling of the same parameter and is still read."""
    return [t for value in [*query.getlist("types"), *query.getlist("type")] for t in value.split(",") if t]


def events_after(job_id: int, after_seq: int = 0, types: Iterable[str] | None = None,
                 limit: int = 1000) -> list[dict[str, Any]]:
    """Stored events with ``seq > after_seq`` in order: the history a page loads before it goes live."""
    qs = JobEvent.objects.filter(job_id=job_id, seq__gt=after_seq)
    if types:
        qs = qs.filter(type__in=list(types))
    return [e.as_message() for e in qs.order_by("seq")[:limit]]


def wire_events_after(job_id: int, after_seq: int, limit: int = 500) -> list[dict[str, Any]]:
    """``events_after`` as a socket sends it (``wire_message``), without reading the payloads that travel as
    stubs: a job's sample events can hold hundreds of megabytes the socket never sends."""
    from django.db.models import TextField
    from django.db.models.functions import Cast, Length

    rows = list(JobEvent.objects.filter(job_id=job_id, seq__gt=after_seq).order_by("seq")
                .annotate(size=Length(Cast("data", TextField())))
                .values("pk", "seq", "type", "step", "time", "size")[:limit])
    inline = [r["pk"] for r in rows if r["type"] != "samples" and r["size"] <= MAX_INLINE_EVENT_BYTES]
    payloads = dict(JobEvent.objects.filter(pk__in=inline).values_list("pk", "data")) if inline else {}
    out = []
    for r in rows:
        message = {"seq": r["seq"], "type": r["type"], "step": r["step"], "time": r["time"]}
        if r["pk"] in payloads:
            out.append(wire_message({**message, "data": payloads[r["pk"]]}))
        else:
            out.append(stub(message, int(r["size"] or 0) + 60))
    return out
