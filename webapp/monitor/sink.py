"""``DatabaseEventSink``: the trainer's event sink that stores a job's events in the database in batches.

``emit`` only appends to an in-memory queue and returns, so the training loop (which may be inside an
asyncio event loop, where the ORM refuses to run) never waits on the database. A writer thread drains the
queue every ``flush_interval`` seconds, or sooner when ``max_batch`` events are waiting, and stores each
batch in one transaction with ``append_events``. ``close`` stores what is left and stops the thread.
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
    def __init__(self, job_id: int, *, flush_interval: float = 0.5, max_batch: int = 200) -> None:
        self.job_id = job_id
        self.flush_interval = flush_interval
        self.max_batch = max_batch
        self.stored = 0
        self.dropped = 0
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
        row.setdefault("time", time.time())
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
        try:
            stopping = False
            while not stopping:
                batch: list[dict[str, Any]] = []
                deadline = time.monotonic() + self.flush_interval
                while len(batch) < self.max_batch:
                    try:
                        item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                    except queue.Empty:
                        break
                    if item is _STOP:
                        stopping = True
                        break
                    batch.append(item)
                if batch:
                    self._store(batch)
        finally:
            connection.close()  # this thread's own connection

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
