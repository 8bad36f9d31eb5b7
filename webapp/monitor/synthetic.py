"""A long job's stored events, made in bulk: the dashboard's browser tests and its open-time benchmark.

``seed_long_job(job, steps)`` stores, per step, what the trainer emits (``trainer/loop.py``): a ``metrics``
event of ~30 numbers under the trainer's names, a ``samples`` event with one trajectory as
``Trajectory.to_dict(tokenizer)`` writes it (token ids, loss mask, logprobs, turns, tool calls, text, mask
segments), and a ``resources`` event (host stats and a pool), each made by the constructors of
``trainer.events`` as the trainer makes its own. Rows go in with PostgreSQL's ``COPY`` (60,000
rows in seconds; ``bulk_create`` elsewhere), not through ``append_events``, which would announce every
batch; ``copy_events`` copies one job's events to another inside the database.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

from django.db import connection, transaction

from trainer.events import Event, HostStats, metrics_event, resources_event, samples_event
from webapp.monitor.models import JobEvent

STAGES = ("rollout", "reward", "logprobs", "update", "weight_sync")


def metrics_payload(step: int, rng: random.Random) -> dict[str, float]:
    reward = 0.2 + 0.6 * (1 - math.exp(-step / 4000)) + rng.gauss(0, 0.05)
    data = {
        "reward/mean": reward, "reward/std": abs(rng.gauss(0.3, 0.05)), "reward/min": reward - 0.4,
        "reward/max": reward + 0.4, "accuracy": min(1.0, max(0.0, reward + rng.gauss(0, 0.03))),
        "loss/policy": rng.gauss(0, 0.02), "kl": abs(rng.gauss(0.01, 0.003)), "entropy": 1.5 - reward / 2,
        "clip_fraction": abs(rng.gauss(0.05, 0.01)), "response_length/mean": 40 + rng.gauss(0, 4),
        "response_length/max": 96.0, "tool_calls/mean": abs(rng.gauss(1.2, 0.2)),
        "tool_errors/mean": abs(rng.gauss(0.1, 0.05)), "tokens_per_second": 900 + rng.gauss(0, 40),
        "logprob_mismatch": abs(rng.gauss(0.001, 0.0003)), "grad_norm": abs(rng.gauss(0.8, 0.1)),
        "advantages/mean": 0.0, "advantages/std": 1.0, "ratio/mean": 1.0 + rng.gauss(0, 0.001),
        "ratio/max": 1.2, "lr": 1e-6, "step": float(step), "time/step": 1.2 + rng.gauss(0, 0.05),
        "time/step_cpu": 2.1, "turns/mean": 2.0, "parse_errors/mean": 0.0,
    }
    data |= {f"time/{s}": abs(rng.gauss(0.2, 0.02)) for s in STAGES}
    return data


def trajectory(step: int, rng: random.Random) -> dict[str, Any]:
    n = 60
    ids = [rng.randrange(100, 5000) for _ in range(n)]
    mask = [0] * 30 + [1] * 30
    return {
        "token_ids": ids, "loss_mask": mask, "logprobs": [round(-rng.random(), 4) if m else 0.0 for m in mask],
        "reward": round(rng.random(), 3), "num_turns": 2, "tool_errors": 0, "parse_errors": 0,
        "finish_reason": "stop", "final_answer": str(step % 97), "error": None,
        "turns": [{"index": 0, "text": "Let me compute that.", "start": 30, "end": 45},
                  {"index": 1, "text": f"The answer is {step % 97}.", "start": 50, "end": 60}],
        "tool_calls": [{"turn": 0, "name": "calculator", "arguments": {"expression": f"{step} % 97"},
                        "observation": str(step % 97), "error": None, "latency": 0.002}],
        "messages": [],
        "text": f"Question {step}: what is {step} mod 97? Let me compute that. The answer is {step % 97}.",
        "segments": [{"start": 0, "end": 30, "mask": 0, "text": f"Question {step}: what is {step} mod 97?"},
                     {"start": 30, "end": 60, "mask": 1, "text": f"Let me compute that. The answer is {step % 97}."}],
    }


def host(step: int) -> HostStats:
    return HostStats(host="worker-1", pid=4242, cpu_count=16, cpu_percent=40 + 30 * math.sin(step / 50),
                     process_cpu_percent=95.0, process_rss_mb=2048 + step / 100, threads=12,
                     memory_used_mb=9000.0, memory_total_mb=32000.0, memory_percent=28 + step / 2000,
                     gpus=[], gpu_absent="NVML found no GPU on this machine")


def resources(step: int, at: float, rng: random.Random) -> Event:
    """A ``resources`` event: the host, the rollout engine's counters and a pool of two sandboxes."""
    return resources_event(step, {"sequences": 4.0 * step, "generated_tokens": 160.0 * step},
                           {"python": {"size": 2, "max": 2, "in_use": rng.randrange(3), "idle": 1, "waiting": 0,
                                       "created": 2, "failed": 0, "acquires": 4 * step}},
                           host=host(step), at=at)


def step_events(step: int, at: float, rng: random.Random) -> list[Event]:
    """One step's ``metrics``, ``samples`` and ``resources`` events, as the trainer emits them."""
    metrics = metrics_event(step, metrics_payload(step, rng), at=at)
    samples = samples_event(step, [trajectory(step, rng)], at=at)
    return [metrics, samples, resources(step, at, rng)]


def seed_long_job(job: Any, steps: int, *, start_step: int = 1, start_time: float = 1.7e9, seed: int = 0,
                  batch: int = 3000) -> int:
    """Store ``steps`` steps of metrics, samples and resources for ``job``; returns the job's last seq."""
    rng = random.Random(seed)
    with transaction.atomic():
        job.refresh_from_db(fields=["last_seq"])
        seq: int = job.last_seq
        rows: list[tuple[int, int, str, int, float, dict[str, Any]]] = []
        for step in range(start_step, start_step + steps):
            for event in step_events(step, start_time + step, rng):
                seq += 1
                rows.append((job.pk, seq, event["type"], event["step"], event["time"], event["data"]))
        _store(rows, batch)
        type(job).objects.filter(pk=job.pk).update(last_seq=seq)
    return seq


def _store(rows: list[tuple[int, int, str, int, float, dict[str, Any]]], batch: int) -> None:
    if connection.vendor == "postgresql":
        table = JobEvent._meta.db_table
        connection.ensure_connection()
        with connection.connection.cursor() as raw, raw.copy(
                f"COPY {table} (job_id, seq, type, step, time, data) FROM STDIN") as copy:
            for *fields, data in rows:
                copy.write_row([*fields, json.dumps(data)])
        return
    JobEvent.objects.bulk_create([JobEvent(job_id=j, seq=q, type=t, step=s, time=at, data=d)
                                  for j, q, t, s, at, d in rows], batch_size=batch)


def copy_events(source: Any, target: Any) -> int:
    """Give ``target`` (a job with no events) a copy of ``source``'s events, in one SQL statement."""
    table = JobEvent._meta.db_table
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {table} (job_id, seq, type, step, time, data) "  # the table name is ours
                       f"SELECT %s, seq, type, step, time, data FROM {table} WHERE job_id = %s", [target.pk, source.pk])
        source.refresh_from_db(fields=["last_seq"])
        type(target).objects.filter(pk=target.pk).update(last_seq=source.last_seq)
    return int(source.last_seq)
