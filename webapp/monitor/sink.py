"""``DatabaseEventSink``: the trainer's event sink that stores a job's events in the database in batches.

``emit`` only appends to an in-memory queue and returns, so the training loop (which may be inside an
asyncio event loop, where the ORM refuses to run) never waits on the database. A writer thread stores each
batch in one transaction with ``append_events``. ``close`` stores what is left and stops the thread.

Low latency when quiet, bounded when busy: every batch is one group message to the job's dashboards, and two
batches are at least ``1 / max_messages_per_second`` apart. An event that finds the sink idle (nothing sent
for that long) goes out at once, alone; events that arrive within the gap after a send wait for its end and
go out together. So a quiet job's events reach a page in milliseconds, and a fast job sends bigger
batches, not more messages, and never floods Redis or a slow browser. ``flush_interval`` (default 0) makes
the first event of a batch wait that long for company, the old fixed window, for callers that prefer
fewer, larger transactions over latency. Within a batch only the newest ``keep_samples`` sample events
are kept.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Mapping
from typing import Any

from django.db import close_old_connections, connection

from webapp.monitor.events import EventError, append_events, normalise

log = logging.getLogger(__name__)

_STOP = object()


class DatabaseEventSink:
    def __init__(self, job_id: int, *, flush_interval: float = 0.0, max_batch: int = 200,
                 max_messages_per_second: float = 20.0, keep_samples: int = 4) -> None:
        if max_messages_per_second <= 0:
            raise ValueError(f"max_messages_per_second must be > 0, got {max_messages_per_second}")
        if keep_samples < 1:
            raise ValueError(f"keep_samples must be >= 1 (the newest sample is always kept), got {keep_samples}")
        self.job_id = job_id
        self.flush_interval = flush_interval
        self.max_batch = max_batch
        # Backpressure: each flush is one transaction and one group message, so a fast job reaches Redis and
        # the browsers at most this often; a flood waits in the queue and goes out in bigger batches instead.
        self.max_messages_per_second = max_messages_per_second
        # Within one flush only the newest `keep_samples` sample events are stored (samples are illustrative
        # and large; metrics, resources, status and logs are never thinned).
        self.keep_samples = keep_samples
        self.stored = 0
        self.dropped = 0
        self.thinned = 0
        self._queue: queue.Queue[Any] = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"event-sink-job-{job_id}", daemon=True)
        self._thread.start()

    def emit(self, event: Mapping[str, Any]) -> None:
        """Queue one event (validated now, so a bad event fails where it was made, not later)."""
        if self._closed:
            raise RuntimeError(f"emit() after close(): the sink of job {self.job_id} is closed")
        row = dict(event)
        normalise(row)
        self._queue.put(row)

    def close(self) -> None:
        """Store every queued event, then stop the writer thread. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join()

    def __enter__(self) -> DatabaseEventSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        min_gap = 1.0 / self.max_messages_per_second
        hard_cap = 20 * self.max_batch  # bounds memory and message size even under a flood
        last_flush = float("-inf")
        try:
            stopping = False
            while not stopping:
                item = self._queue.get()  # idle: block until there is something to send
                if item is _STOP:
                    break
                batch: list[dict[str, Any]] = [item]
                # Send at once if the previous send is min_gap old (a quiet job); else wait out the gap (a
                # busy one), collecting what arrives meanwhile. A full batch still waits for the gap.
                linger_until = time.monotonic() + self.flush_interval
                while len(batch) < hard_cap:
                    earliest = last_flush + min_gap
                    until = earliest if len(batch) >= self.max_batch else max(linger_until, earliest)
                    wait = until - time.monotonic()
                    try:
                        item = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is _STOP:
                        stopping = True
                        break
                    batch.append(item)
                last_flush = time.monotonic()
                self._store(self._thin_samples(batch))
        finally:
            connection.close()  # this thread's own connection

    def _thin_samples(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Drop all but the newest ``keep_samples`` sample events of the batch, keeping the order of the rest."""
        sample_positions = [i for i, e in enumerate(batch) if e.get("type") == "samples"]
        if len(sample_positions) <= self.keep_samples:
            return batch
        drop = set(sample_positions[: -self.keep_samples])
        self.thinned += len(drop)
        return [e for i, e in enumerate(batch) if i not in drop]

    def _store(self, batch: list[dict[str, Any]]) -> None:
        close_old_connections()
        for attempt in range(3):
            try:
                append_events(self.job_id, batch)
                self.stored += len(batch)
                return
            except EventError:
                raise
            except Exception:
                # A dropped connection or a locked SQLite file: retry on a fresh connection, then give up on
                # this batch rather than stall training forever.
                log.warning("storing %d events of job %d failed (attempt %d)", len(batch), self.job_id,
                            attempt + 1, exc_info=True)
                connection.close()
                time.sleep(0.2 * (attempt + 1))
        self.dropped += len(batch)
