"""A job's history as a dashboard draws it: downsampled columns, the list of sample steps, the recent log.

A 20,000-step job has 20,000 metrics events of ~30 numbers, as many resource samples and as many sample
events (megabytes each with token texts). A page never loads them: ``job_series`` reads the numbers only,
and cuts each column to at most ``points`` points with min/max per bucket (tsdownsample's
``MinMaxDownsampler``: each bucket keeps its smallest and largest value, so a spike or a collapse in reward
is never averaged away). Below the budget a column is exact. When the user zooms, the page asks again for
the visible step range and gets it at full resolution (or downsampled to the budget if still longer).

The answer names ``last_seq``, the newest event it covers: the page then connects its socket with
``?after=last_seq`` and hears everything later once, with no gap and no duplicate.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from webapp.monitor.events import wire_message
from webapp.monitor.models import JobEvent

DEFAULT_POINTS = 800
MAX_POINTS = 20_000
LOG_TAIL = 300  # status, checkpoint and log events the page's log list starts with
# A spread drawn around a mean (the reward band) is sampled where its mean is, so the band follows the line.
COMPANIONS = ("std", "min", "max")


def minmax_indices(y: np.ndarray, points: int) -> np.ndarray:
    """Indices of the points to draw: all of them when ``len(y) <= points``, else the min and the max of
    each of ``points // 2`` equal buckets, in order. NaN (a gap) is never chosen over a number."""
    n = len(y)
    if n <= points:
        return np.arange(n)
    from tsdownsample import MinMaxDownsampler, NaNMinMaxDownsampler

    budget = max(2, points - points % 2)  # MinMax needs an even number of points
    sampler = NaNMinMaxDownsampler() if np.isnan(y).any() else MinMaxDownsampler()
    return np.asarray(sampler.downsample(y, n_out=budget), dtype=np.int64)


def _companion_of(key: str, keys: set[str]) -> str | None:
    for sep in ("/", "_"):
        head, _, tail = key.rpartition(sep)
        if head and tail in COMPANIONS and f"{head}{sep}mean" in keys:
            return f"{head}{sep}mean"
    return None


Arrays = dict[str, tuple[np.ndarray, np.ndarray]]  # key -> (x, y), in seq order


def columns(x: list[float], rows: list[dict[str, Any]], points: int) -> dict[str, dict[str, list[Any]]]:
    """``{key: {"x": [...], "y": [...]}}`` of the numeric values of ``rows`` (one dict per x), each column
    downsampled to ``points`` on its own (a companion at its mean's points)."""
    xs: dict[str, list[float]] = {}
    ys: dict[str, list[float]] = {}
    for at, row in zip(x, rows, strict=True):
        for k, v in row.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                xs.setdefault(k, []).append(at)
                ys.setdefault(k, []).append(float(v))
    return downsampled({k: (np.asarray(xs[k], dtype=np.float64), np.asarray(ys[k], dtype=np.float64))
                        for k in xs}, points)


def downsampled(arrays: Arrays, points: int) -> dict[str, dict[str, list[Any]]]:
    keys = set(arrays)
    out: dict[str, dict[str, list[Any]]] = {}
    chosen_x: dict[str, np.ndarray] = {}
    for key in sorted(keys, key=lambda k: _companion_of(k, keys) is not None):
        x, y = arrays[key]
        mean = _companion_of(key, keys)
        if mean is not None:
            wanted = set(chosen_x[mean].tolist())
            idx = np.flatnonzero([v in wanted for v in x.tolist()])
        else:
            idx = minmax_indices(y, points)
        chosen_x[key] = x[idx]
        out[key] = {"x": _plain(x[idx]), "y": y[idx].tolist()}
    return out


# PostgreSQL takes the numbers out of the payloads itself: parsing 20,000 payloads of 30 numbers in Python
# costs seconds, aggregating them there a fraction of one. (Other databases, the demo's SQLite, take the
# Python path.) Each query gives (key, [x...], [y...]) in seq order.
_METRICS_SQL = """
SELECT kv.key, json_agg(COALESCE(e.step, e.seq) ORDER BY e.seq), json_agg((kv.value)::float8 ORDER BY e.seq)
FROM {table} e CROSS JOIN LATERAL jsonb_each(e.data) kv
WHERE e.job_id = %s AND e.type = 'metrics' AND e.seq <= %s AND jsonb_typeof(kv.value) = 'number' {where}
GROUP BY kv.key
"""
_RESOURCES_SQL = """
SELECT c.key, json_agg(e.time ORDER BY e.seq), json_agg(c.value ORDER BY e.seq)
FROM {table} e CROSS JOIN LATERAL (
    SELECT 'host/' || k AS key, (e.data->'host'->>k)::float8 AS value
    FROM unnest(ARRAY['cpu_percent', 'memory_percent']) k WHERE jsonb_typeof(e.data->'host'->k) = 'number'
    UNION ALL
    SELECT 'gpu/' || (g->>'index') || '/' || k, (g->>k)::float8
    FROM jsonb_array_elements(CASE WHEN jsonb_typeof(e.data->'host'->'gpus') = 'array'
                                   THEN e.data->'host'->'gpus' ELSE '[]'::jsonb END) g,
         unnest(ARRAY['util_percent', 'memory_percent']) k WHERE jsonb_typeof(g->k) = 'number'
    UNION ALL
    SELECT 'pool/' || p.key || '/' || k, (p.value->>k)::float8
    FROM jsonb_each(CASE WHEN jsonb_typeof(e.data->'pools') = 'object' THEN e.data->'pools' ELSE '{{}}'::jsonb END) p,
         unnest(ARRAY['in_use', 'waiting']) k WHERE jsonb_typeof(p.value->k) = 'number'
) c
WHERE e.job_id = %s AND e.type = 'resources' AND e.seq <= %s
GROUP BY c.key
"""


def _pg_arrays(sql: str, params: list[Any]) -> Arrays:
    import json

    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    out: Arrays = {}
    for key, x, y in rows:
        x, y = (json.loads(v) if isinstance(v, str) else v for v in (x, y))
        out[key] = (np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))
    return out


def norm_key(key: str) -> str:
    """A metric's name as the dashboard's charts spell it (``normKey`` in monitor.js): ``reward/mean`` is
    ``reward_mean``. A zoom names the chart's metrics this way."""
    return re.sub(r"[^a-z0-9]+", "_", key.lower()).strip("_")


def _number(value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return math.nan


def _plain(values: np.ndarray) -> list[Any]:
    """Steps as ints (JSON ``12``, not ``12.0``), times as floats."""
    return [int(v) if v.is_integer() else v for v in values.tolist()]


def flat_numbers(data: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """A metrics payload's numbers, nested dicts flattened as ``outer/inner`` (the trainer's own spelling)."""
    out: dict[str, float] = {}
    for k, v in data.items():
        key = f"{prefix}/{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(flat_numbers(v, key))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[key] = v
    return out


def _resource_row(host: Any, gpus: Any, pools: Any) -> dict[str, float]:
    row: dict[str, float] = {}
    if isinstance(host, dict):
        for k in ("cpu_percent", "memory_percent"):
            if isinstance(host.get(k), (int, float)):
                row[f"host/{k}"] = host[k]
    for g in gpus if isinstance(gpus, list) else []:
        if isinstance(g, dict):
            for k in ("util_percent", "memory_percent"):
                if isinstance(g.get(k), (int, float)):
                    row[f"gpu/{g.get('index')}/{k}"] = g[k]
    for name, s in (pools if isinstance(pools, dict) else {}).items():
        if isinstance(s, dict):
            for k in ("in_use", "waiting"):
                if isinstance(s.get(k), (int, float)):
                    row[f"pool/{name}/{k}"] = s[k]
    return row


def _metric_arrays(job_id: int, last_seq: int, first_step: int | None, last_step: int | None) -> Arrays:
    from django.db import connection

    if connection.vendor == "postgresql":
        where, params = "", [job_id, last_seq]
        if first_step is not None:
            where, params = where + " AND e.step >= %s", [*params, first_step]
        if last_step is not None:
            where, params = where + " AND e.step <= %s", [*params, last_step]
        return _pg_arrays(_METRICS_SQL.format(table=JobEvent._meta.db_table, where=where), params)
    events = JobEvent.objects.filter(job_id=job_id, seq__lte=last_seq, type="metrics")
    if first_step is not None:
        events = events.filter(step__gte=first_step)
    if last_step is not None:
        events = events.filter(step__lte=last_step)
    xs: dict[str, list[float]] = {}
    ys: dict[str, list[float]] = {}
    for seq, step, data in events.order_by("seq").values_list("seq", "step", "data"):
        for k, v in (flat_numbers(data) if isinstance(data, dict) else {}).items():
            if math.isfinite(v):
                xs.setdefault(k, []).append(step if step is not None else seq)
                ys.setdefault(k, []).append(float(v))
    return {k: (np.asarray(xs[k], dtype=np.float64), np.asarray(ys[k], dtype=np.float64)) for k in xs}


def _resource_arrays(job_id: int, last_seq: int) -> Arrays:
    from django.db import connection

    if connection.vendor == "postgresql":
        return _pg_arrays(_RESOURCES_SQL.format(table=JobEvent._meta.db_table), [job_id, last_seq])
    times: list[float] = []
    rows: list[dict[str, float]] = []
    for at, host, pools in (JobEvent.objects.filter(job_id=job_id, seq__lte=last_seq, type="resources")
                            .order_by("seq").values_list("time", "data__host", "data__pools")):
        times.append(at)
        rows.append(_resource_row(host, host.get("gpus") if isinstance(host, dict) else None, pools))
    xs: dict[str, list[float]] = {}
    ys: dict[str, list[float]] = {}
    for at, row in zip(times, rows, strict=True):
        for k, v in row.items():
            xs.setdefault(k, []).append(at)
            ys.setdefault(k, []).append(float(v))
    return {k: (np.asarray(xs[k], dtype=np.float64), np.asarray(ys[k], dtype=np.float64)) for k in xs}


def job_series(job_id: int, last_seq: int, *, first_step: int | None = None, last_step: int | None = None,
               points: int = DEFAULT_POINTS, keys: list[str] | None = None, full: bool = True) -> dict[str, Any]:
    """The history of events ``seq <= last_seq`` in the step range: ``metrics`` and ``resources`` columns,
    and (``full``) the sample index ``[[step, seq], ...]``, the newest resources event and the log tail.
    ``keys`` (names as ``norm_key`` spells them) limits the metrics to a chart's."""
    metrics = _metric_arrays(job_id, last_seq, first_step, last_step)
    if keys is not None:
        metrics = {k: v for k, v in metrics.items() if norm_key(k) in keys}
    answer: dict[str, Any] = {"last_seq": last_seq, "points": points, "metrics": downsampled(metrics, points)}
    if not full:
        return answer
    events = JobEvent.objects.filter(job_id=job_id, seq__lte=last_seq)
    answer["resources"] = downsampled(_resource_arrays(job_id, last_seq), points)
    latest = events.filter(type="resources").order_by("-seq").first()
    answer["latest_resources"] = latest.as_message() if latest else None
    answer["samples"] = [[step, seq] for seq, step in
                         events.filter(type="samples").order_by("seq").values_list("seq", "step")]
    tail = events.filter(type__in=["status", "checkpoint", "log"]).order_by("-seq")[:LOG_TAIL]
    answer["log"] = [wire_message(e.as_message()) for e in reversed(tail)]
    return answer
