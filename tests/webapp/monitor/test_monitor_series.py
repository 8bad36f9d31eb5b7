"""A long job's history as the dashboard loads it: downsampled columns that keep each bucket's extremes,
pages sized in bytes, sample events served one at a time."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from trainer.events import log_event, metrics_event, resources_event, samples_event
from webapp.jobs.models import Status, TrainingJob
from webapp.monitor.events import MESSAGE_BUDGET_BYTES, append_events, pages_by_size, wire_message
from webapp.monitor.series import columns, minmax_indices
from webapp.monitor.synthetic import host, seed_long_job


def test_below_the_point_budget_a_column_is_exact() -> None:
    y = np.array([3.0, -1.0, 7.5, 0.0])
    assert minmax_indices(y, 4).tolist() == [0, 1, 2, 3]
    out = columns([10, 11, 12, 13], [{"loss": v} for v in y.tolist()], points=100)
    assert out == {"loss": {"x": [10, 11, 12, 13], "y": [3.0, -1.0, 7.5, 0.0]}}


def test_the_downsampler_keeps_the_min_and_the_max_of_every_bucket() -> None:
    rng = np.random.default_rng(0)
    y = rng.normal(size=10_000)
    y[1234], y[8765] = 50.0, -50.0  # one spike and one collapse a mean would flatten
    points = 200
    idx = minmax_indices(y, points)
    assert len(idx) <= points and list(idx) == sorted(set(idx.tolist()))
    kept = set(idx.tolist())
    assert {1234, 8765} <= kept
    # No extreme is lost anywhere: each stretch of one bucket's width has its max and min among the kept
    # points within a bucket of it (the library's buckets need not line up with these).
    kept_idx = np.asarray(sorted(kept))
    for bucket in np.array_split(np.arange(len(y)), points // 2):
        width = len(bucket)
        near = kept_idx[(kept_idx >= bucket[0] - width) & (kept_idx <= bucket[-1] + width)]
        assert y[bucket].max() <= y[near].max() and y[bucket].min() >= y[near].min()


def test_a_spread_is_sampled_where_its_mean_is_so_the_band_follows_the_line() -> None:
    rows = [{"reward/mean": float(i % 17), "reward/std": 0.1 * i} for i in range(5000)]
    out = columns(list(range(5000)), rows, points=100)
    assert out["reward/std"]["x"] == out["reward/mean"]["x"] and len(out["reward/mean"]["x"]) <= 100


def _event(seq: int, size: int) -> dict[str, Any]:
    return {"seq": seq, "type": "log", "step": seq, "time": 1.0, "data": {"message": "x" * size}}


def test_pages_never_exceed_the_byte_budget_and_carry_every_event_once_in_order() -> None:
    rng = np.random.default_rng(1)
    events = [_event(i + 1, int(rng.integers(10, 40_000))) for i in range(600)]
    budget = 100_000
    pages = list(pages_by_size(events, budget))
    assert [e["seq"] for page in pages for e in page] == list(range(1, 601))
    sizes = [len(json.dumps({"type": "events", "events": page})) for page in pages]
    assert max(sizes) <= budget
    assert len(pages) < 600 / 2, "pages are filled, not one event each"


def test_an_event_over_the_inline_limit_travels_as_a_stub_and_a_sample_always_does() -> None:
    big = wire_message(_event(1, 200_000))
    assert big["stub"] is True and big["data"] is None and big["bytes"] > 200_000
    sample = wire_message({"seq": 2, "type": "samples", "step": 1, "time": 1.0, "data": {"trajectories": [{}]}})
    assert sample["stub"] is True and sample["step"] == 1
    small = _event(3, 10)
    assert wire_message(small) is small
    assert len(json.dumps({"type": "events", "events": [big, sample]})) < MESSAGE_BUDGET_BYTES


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _series_queries(client: Client, job: Any) -> tuple[dict[str, Any], list[str]]:
    with CaptureQueriesContext(connection) as queries:
        answer = client.get(f"/monitor/jobs/{job.pk}/series.json?points=200").json()
    return answer, [q["sql"] for q in queries.captured_queries]


@pytest.mark.django_db
def test_series_json_of_a_long_job_is_downsampled_and_names_the_seq_it_covers(alice: Any, alice_job: Any) -> None:
    last = seed_long_job(alice_job, 3000)
    short_job = TrainingJob.objects.create(team=alice_job.team, created_by=alice, name="short",
                                           status=Status.RUNNING, config={"steps": 10})
    seed_long_job(short_job, 30)
    client = signed_in(alice)
    answer, queries = _series_queries(client, alice_job)
    _, short_queries = _series_queries(client, short_job)
    # Read in bulk: the same few queries for 9,000 events as for 90 (none per event or per step), the
    # metrics payloads fetched as text in one of them for orjson, not decoded row by row by the ORM.
    assert len(queries) == len(short_queries) < 20, queries
    assert sum('::text' in q and "'metrics'" in q for q in queries) == 1, queries
    assert answer["last_seq"] == last == 9000
    reward = answer["metrics"]["reward/mean"]
    assert 100 < len(reward["x"]) <= 200 and reward["x"] == sorted(reward["x"])
    assert len(answer["metrics"]) >= 30
    assert len(answer["resources"]["host/cpu_percent"]["x"]) <= 200
    assert answer["samples"][:2] == [[1, 2], [2, 5]] and len(answer["samples"]) == 3000
    assert answer["latest_resources"]["seq"] == 9000
    # A zoom: the chart's own metrics in the visible range, at full resolution.
    zoom = client.get(f"/monitor/jobs/{alice_job.pk}/series.json?from=100&to=199&keys=reward_mean,reward_std").json()
    assert set(zoom["metrics"]) == {"reward/mean", "reward/std"}
    assert zoom["metrics"]["reward/mean"]["x"] == list(range(100, 200))
    assert "samples" not in zoom


@pytest.mark.django_db
def test_one_sample_event_is_fetched_in_full_by_seq_and_only_by_its_team(alice: Any, bob: Any,
                                                                         alice_job: Any) -> None:
    append_events(alice_job.pk, [samples_event(4, [{"reward": 1.0, "token_ids": [1]}])])
    answer = signed_in(alice).get(f"/monitor/jobs/{alice_job.pk}/events/1.json").json()
    assert answer["step"] == 4 and answer["data"]["trajectories"][0]["reward"] == 1.0
    assert signed_in(bob).get(f"/monitor/jobs/{alice_job.pk}/events/1.json").status_code == 404
    assert signed_in(alice).get(f"/monitor/jobs/{alice_job.pk}/events/2.json").status_code == 404


@pytest.mark.django_db
def test_series_json_refuses_bad_parameters_naming_them(alice: Any, alice_job: Any) -> None:
    client = signed_in(alice)
    assert "points must be an integer" in client.get(f"/monitor/jobs/{alice_job.pk}/series.json?points=1").json()["error"]
    assert "from= and to=" in client.get(f"/monitor/jobs/{alice_job.pk}/series.json?from=x").json()["error"]


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
async def test_a_history_of_large_events_reaches_the_socket_in_pages_under_the_byte_budget(
        alice_job: Any, alice_cookie: Any) -> None:
    from tests.webapp.monitor.test_monitor_consumer import append, communicator

    trajectory = {"token_ids": list(range(3000)), "text": "t" * 20_000}
    await append(alice_job.pk, [log_event(0, "m" * 50_000) for _ in range(12)]
                 + [samples_event(s, [trajectory] * 4) for s in range(6)]
                 + [log_event(0, "huge " * 30_000)])
    comm = communicator(alice_job.pk, [alice_cookie])
    assert (await comm.connect())[0]
    assert (await comm.receive_json_from())["type"] == "hello"
    seqs: list[int] = []
    while True:
        raw = await comm.receive_output(timeout=10)
        text = raw["text"]
        assert len(text.encode()) <= MESSAGE_BUDGET_BYTES, len(text)
        message = json.loads(text)
        if message["type"] == "live":
            break
        seqs.extend(e["seq"] for e in message["events"])
        for e in message["events"]:
            if e["type"] == "samples" or e["seq"] == 19:
                assert e["stub"] is True and e["data"] is None
            else:
                assert e["data"]["message"].startswith("m")
    assert seqs == list(range(1, 20))
    await comm.disconnect()


def _resumed(parent: Any, step: int, **fields: Any) -> Any:
    """A job resumed from ``parent``'s checkpoint of ``step`` (rows only: the history is what is tested)."""
    from webapp.jobs.models import Checkpoint, Status, TrainingJob

    checkpoint = Checkpoint.objects.create(job=parent, step=step, path=f"/runs/{parent.pk}/step-{step}")
    return TrainingJob.objects.create(**{"team": parent.team, "created_by": parent.created_by,
                                         "name": f"{parent.name} (resumed)", "status": Status.RUNNING,
                                         "config": {"steps": 30}, "resumed_from": checkpoint, **fields})


@pytest.mark.django_db
def test_a_resumed_jobs_history_is_its_parents_up_to_the_resume_step_then_its_own(alice: Any,
                                                                                   alice_job: Any) -> None:
    seed_long_job(alice_job, 14)  # the parent ran to step 14 but its last checkpoint is step 10
    child = _resumed(alice_job, 10)
    seed_long_job(child, 5, start_step=11, seed=1)
    answer = signed_in(alice).get(f"/monitor/jobs/{child.pk}/series.json").json()
    reward = answer["metrics"]["reward/mean"]
    assert reward["x"] == list(range(1, 16))
    parent_rewards = {e.step: e.data["reward/mean"] for e in alice_job.events.filter(type="metrics")}
    own_rewards = {e.step: e.data["reward/mean"] for e in child.events.filter(type="metrics")}
    assert reward["y"] == [parent_rewards[s] for s in range(1, 11)] + [own_rewards[s] for s in range(11, 16)]
    assert answer["metrics"]["reward/std"]["x"] == reward["x"], "the band follows the joined line"
    assert answer["lineage"] == [{"id": alice_job.pk, "name": alice_job.name, "to_step": 10}]
    assert answer["starts"] == [1, 11]
    # Everything else is the job's own: its seq range, its samples.
    child.refresh_from_db()
    assert answer["last_seq"] == child.last_seq and [s for s, _ in answer["samples"]] == list(range(11, 16))
    # A zoom into the parent's part answers from the parent's events.
    zoom = signed_in(alice).get(f"/monitor/jobs/{child.pk}/series.json?from=8&to=12&keys=reward_mean").json()
    assert zoom["metrics"]["reward/mean"]["x"] == [8, 9, 10, 11, 12]


@pytest.mark.django_db
def test_a_resume_chain_shows_every_ancestors_steps_in_order(alice: Any, alice_job: Any) -> None:
    seed_long_job(alice_job, 6)
    child = _resumed(alice_job, 4)
    seed_long_job(child, 6, start_step=5)
    grandchild = _resumed(child, 8)
    seed_long_job(grandchild, 2, start_step=9)
    answer = signed_in(alice).get(f"/monitor/jobs/{grandchild.pk}/series.json").json()
    assert answer["metrics"]["accuracy"]["x"] == list(range(1, 11))
    assert [a["id"] for a in answer["lineage"]] == [alice_job.pk, child.pk]
    assert answer["starts"] == [1, 5, 9]


@pytest.mark.django_db
def test_a_job_resumed_from_another_teams_checkpoint_shows_only_its_own_history(alice: Any, bob: Any,
                                                                                  alice_job: Any) -> None:
    from webapp.accounts.models import Team

    seed_long_job(alice_job, 10)
    bobs = _resumed(alice_job, 10, team=Team.objects.of(bob).get(), created_by=bob)
    seed_long_job(bobs, 3, start_step=11)
    answer = signed_in(bob).get(f"/monitor/jobs/{bobs.pk}/series.json").json()
    assert answer["metrics"]["reward/mean"]["x"] == [11, 12, 13]
    assert answer["lineage"] == []


@pytest.mark.django_db
def test_a_run_without_points_yet_starts_at_the_step_after_its_parents_checkpoint(alice: Any,
                                                                                    alice_job: Any) -> None:
    assert signed_in(alice).get(f"/monitor/jobs/{alice_job.pk}/series.json").json()["starts"] == [1]
    seed_long_job(alice_job, 6)
    child = _resumed(alice_job, 4)
    answer = signed_in(alice).get(f"/monitor/jobs/{child.pk}/series.json").json()
    assert answer["starts"] == [1, 5] and answer["metrics"]["reward/mean"]["x"] == [1, 2, 3, 4]


def test_series_json_carries_each_pools_peak_per_step_and_the_steps_wall_times(alice: Any, alice_job: Any) -> None:
    append_events(alice_job.pk, [
        metrics_event(1, {"reward/mean": 0.1}),
        resources_event(1, {}, {"kv": {"in_use": 0, "peak_in_use": 32, "waiting": 0}}, host=host(1)),
        metrics_event(2, {"reward/mean": 0.2}),
    ])
    client = Client()
    client.force_login(alice)
    answer = client.get(f"/monitor/jobs/{alice_job.pk}/series.json").json()
    assert answer["resources"]["pool/kv/peak_in_use"]["y"] == [32.0]  # 0 held between steps, 32 during step 1
    assert answer["times"]["x"] == [1, 2] and answer["times"]["y"][0] <= answer["times"]["y"][1]
