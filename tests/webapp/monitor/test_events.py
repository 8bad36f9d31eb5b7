"""Job events: gap-free per-job sequence numbers under concurrent writers, batching, and the group announcement."""

from __future__ import annotations

import asyncio
import math
import threading
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import connection

from trainer.events import log_event, metrics_event, samples_event, status_event
from webapp.jobs import actions, worker
from webapp.jobs.models import Checkpoint, Status, TrainingJob
from webapp.monitor.events import EventError, append_events, normalise
from webapp.monitor.models import JobEvent
from webapp.monitor.sink import DatabaseEventSink


@pytest.fixture
def job(alice: Any, team_a: Any) -> TrainingJob:
    return TrainingJob.objects.create(team=team_a, created_by=alice, name="events", config={}, status=Status.RUNNING)


def test_an_event_is_stored_as_the_trainers_constructor_made_it_and_a_flat_one_is_refused() -> None:
    made = normalise(metrics_event(2, {"reward/mean": 0.5}, run="job-1", at=5.0))
    assert made == {"type": "metrics", "step": 2, "time": 5.0, "data": {"reward/mean": 0.5}}
    with pytest.raises(EventError, match=r"not \['reward/mean'\]"):
        normalise({"type": "metrics", "step": 2, "time": 5.0, "reward/mean": 0.5})
    with pytest.raises(EventError, match="has no data: make it with a constructor of trainer"):
        normalise({"type": "metrics", "step": 2, "time": 5.0})


@pytest.mark.parametrize(("event", "message"), [
    ({"type": "gossip"}, "event type 'gossip' is not one of"),
    ({"step": 1}, "event type None"),
    ({"type": "metrics", "step": "one"}, "event step must be an integer"),
    ({"type": "metrics", "step": 1.5}, "event step must be an integer"),
    ({"type": "metrics", "time": "noon"}, "event time must be a Unix timestamp"),
    ({"type": "metrics", "time": math.nan}, "event time must be a Unix timestamp"),
    (["metrics"], "an event must be a dict"),
])
def test_a_malformed_event_is_refused_naming_the_field(event: Any, message: str) -> None:
    with pytest.raises(EventError, match=message):
        normalise(event)


def test_non_finite_numbers_are_stored_as_null(job: TrainingJob) -> None:
    (stored,) = append_events(job.pk, [metrics_event(1, {"loss": math.inf, "kl": math.nan, "ok": 1.0})])
    stored.refresh_from_db()
    assert stored.data == {"loss": None, "kl": None, "ok": 1.0}


@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_get_disjoint_gap_free_sequence_numbers(job: TrainingJob) -> None:
    def write(n: int) -> None:
        try:
            for i in range(10):
                append_events(job.pk, [log_event(0, f"{n}-{i}"), log_event(0, "x")])
        finally:
            connection.close()

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seqs = list(JobEvent.objects.filter(job=job).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, 81))
    job.refresh_from_db()
    assert job.last_seq == 80


@pytest.mark.django_db(transaction=True)
def test_the_sink_stores_batches_and_announces_them_to_the_jobs_group(job: TrainingJob, settings: Any) -> None:
    from channels.layers import channel_layers

    channel_layers.backends.clear()
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(f"job-{job.pk}", channel)
    try:
        sink = DatabaseEventSink(job.pk, flush_interval=0.05, max_batch=50)
        for step in range(1, 121):
            sink.emit(metrics_event(step, {"reward/mean": step / 120}))
        sink.close()
        assert sink.stored == 120 and sink.dropped == 0
        announced: list[dict[str, Any]] = []

        async def receive_all() -> None:  # one event loop for all receives, as a consumer has
            while len(announced) < 120:
                # Bounded: a lost announcement fails the test with a timeout instead of hanging the suite.
                message = await asyncio.wait_for(layer.receive(channel), timeout=15)
                assert message["type"] == "job.events" and message["job_id"] == job.pk
                assert message["first_seq"] == (announced[-1]["seq"] + 1 if announced else 1)
                announced.extend(message["events"])

        async_to_sync(receive_all)()
        assert [e["step"] for e in announced] == list(range(1, 121))
        stored = [e.as_message() for e in JobEvent.objects.filter(job=job).order_by("seq")]
        assert stored == announced  # the socket announces exactly what the database holds
    finally:
        async_to_sync(layer.group_discard)(f"job-{job.pk}", channel)
        channel_layers.backends.clear()


@pytest.mark.django_db(transaction=True)
def test_a_sampled_nul_character_is_stored_as_a_replacement_and_loses_none_of_its_batch(job: TrainingJob) -> None:
    # PostgreSQL's jsonb refuses "\u0000", and a tiny model samples it: the sink used to retry, then drop the
    # whole batch, the metrics and statuses beside the sample too.
    sink = DatabaseEventSink(job.pk, flush_interval=5.0)
    sink.emit(status_event(5, "running", "training from step 5"))
    sink.emit(metrics_event(6, {"reward/mean": 0.5}))
    sink.emit(samples_event(6, [{"text": "Ob\x00 2+2", "\x00": 1}]))
    sink.close()  # one flush: the three go in one batch
    assert (sink.stored, sink.dropped) == (3, 0)
    stored = list(JobEvent.objects.filter(job=job).order_by("seq").values_list("type", "step", "data"))
    assert [(t, s) for t, s, _ in stored] == [("status", 5), ("metrics", 6), ("samples", 6)]
    assert stored[2][2] == {"trajectories": [{"text": "Ob\ufffd 2+2", "\ufffd": 1}]}


def test_a_closed_sink_refuses_more_events(job: TrainingJob) -> None:
    sink = DatabaseEventSink(job.pk)
    sink.close()
    sink.close()  # idempotent
    with pytest.raises(RuntimeError, match="after close"):
        sink.emit(log_event(0, "late"))


def test_a_job_whose_heartbeat_stopped_is_failed_and_points_at_its_checkpoint(job: TrainingJob, alice: Any,
                                                                               team_a: Any, settings: Any) -> None:
    from datetime import timedelta

    from django.utils import timezone

    settings.JOB_HEARTBEAT_TIMEOUT = 30
    stale_at = timezone.now() - timedelta(seconds=31)
    TrainingJob.objects.filter(pk=job.pk).update(heartbeat_at=stale_at, worker="gpu-7:123")
    Checkpoint.objects.create(job=job, step=4, path="/runs/job/checkpoint-000004")
    alive = TrainingJob.objects.create(team=team_a, created_by=alice, name="alive", config={}, status=Status.RUNNING,
                                       heartbeat_at=timezone.now())
    assert worker.sweep_stale_jobs() == [job.pk]
    job.refresh_from_db()
    alive.refresh_from_db()
    assert job.status == Status.FAILED and alive.status == Status.RUNNING
    assert "gpu-7:123 stopped sending heartbeats" in job.error and "last checkpoint is step 4" in job.error
    assert worker.sweep_stale_jobs() == []  # a second sweep changes nothing
    # A late finish from the "dead" worker does not overwrite the verdict.
    assert worker.finish_job(job.pk, Status.SUCCEEDED) is None


def test_a_redelivered_or_cancelled_job_is_not_claimed_twice(job: TrainingJob, alice: Any, team_a: Any) -> None:
    queued = TrainingJob.objects.create(team=team_a, created_by=alice, name="q", config={})
    assert worker.claim_job(queued.pk) is True
    assert worker.claim_job(queued.pk) is False
    cancelled = TrainingJob.objects.create(team=team_a, created_by=alice, name="c", config={})
    actions.do_cancel_job(cancelled)
    assert worker.claim_job(cancelled.pk) is False


def test_the_heartbeat_tells_the_worker_to_stop_when_cancelled_or_no_longer_running(job: TrainingJob) -> None:
    assert worker.beat(job.pk) is False
    TrainingJob.objects.filter(pk=job.pk).update(cancel_requested=True)
    assert worker.beat(job.pk) is True
    TrainingJob.objects.filter(pk=job.pk).update(cancel_requested=False, status=Status.FAILED)
    assert worker.beat(job.pk) is True
