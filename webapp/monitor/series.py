"""A job's history as a dashboard draws it: downsampled columns, the list of sample steps, the recent log.

A 20,000-step job has 20,000 metrics events of ~30 numbers, as many resource samples and as many sample
events (megabytes each with token texts). A page never loads them: ``job_series`` reads the numbers only,
and cuts each column to at most ``points`` points with min/max per bucket (tsdownsample's
``MinMaxDownsampler``: each bucket keeps its smallest and largest value, so a spike or a collapse in reward
is never averaged away). Below the budget a column is exact. When the user zooms, the page asks again for
the visible step range and gets it at full resolution (or downsampled to the budget if still longer).

The answer names ``last_seq``, the newest event it covers: the page then connects its socket with
``?after=last_seq`` and hears everything later once, with no gap and no duplicate.

A resumed job continues its parent's curves: its metric columns start with the parent's points up to the
step of the checkpoint it resumed from (and, for a chain of resumes, the grandparent's before those), then
its own. ``last_seq`` and everything else (samples, resources, log) are the job's own; the caller names the
ancestors (``Ancestor``), already checked to be jobs of the same team.
"""

from __future__ import annotations

import math
import re
from typing import Any, NamedTuple

import numpy as np

from trainer.events import MetricsData, ResourcesData
from webapp.monitor.events import wire_message
from webapp.monitor.models import JobEvent

DEFAULT_POINTS = 600  # per column: two per pixel of a chart about 300 px wide, min and max
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
    sampler = NaNMinMaxDownsampler() if np.isnan(y).any() else MinMaxDownsampler()  # type: ignore[no-untyped-call]
    return np.asarray(sampler.downsample(y, n_out=budget), dtype=np.int64)


def _companion_of(key: str, keys: set[str]) -> str | None:
    for sep in ("/", "_"):
        head, _, tail = key.rpartition(sep)
        if head and tail in COMPANIONS and f"{head}{sep}mean" in keys:
            return f"{head}{sep}mean"
    return None


Arrays = dict[str, tuple[np.ndarray, np.ndarray]]  # key -> (x, y), in seq order


class Ancestor(NamedTuple):
    """A job whose history a resumed job continues: its events up to ``last_seq``, steps up to ``to_step``."""

    job_id: int
    last_seq: int
    to_step: int


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


def norm_key(key: str) -> str:
    """A metric's name as the dashboard's charts spell it (``normKey`` in monitor.js): ``reward/mean`` is
    ``reward_mean``. A zoom names the chart's metrics this way."""
    return re.sub(r"[^a-z0-9]+", "_", key.lower()).strip("_")


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


def _resource_row(data: ResourcesData) -> dict[str, float]:
    """The numbers of a ``resources`` payload the resource panel plots. ``None`` (a non-finite number, stored
    as JSON null) is a gap."""
    host, engine = data["host"], data["engine"]
    values: dict[str, float | None] = {f"host/{k}": host[k] for k in ("cpu_percent", "memory_percent")}
    for k in ("sequences", "generated_tokens"):  # the rollout engine's counters (every engine reports both)
        if k in engine:
            values[f"engine/{k}"] = engine[k]
    for g in host["gpus"]:
        values |= {f"gpu/{g['index']}/{k}": g[k] for k in ("util_percent", "memory_percent")}
    for name, pool in data["pools"].items():
        values |= {f"pool/{name}/{k}": pool[k] for k in ("in_use", "peak_in_use", "waiting") if k in pool}
    return {k: v for k, v in values.items() if v is not None}


def _metric_arrays(job_id: int, last_seq: int, first_step: int | None, last_step: int | None) -> Arrays:
    """Each metric's (steps, values) in seq order. The payloads come as text and orjson parses them: the
    ORM's json.loads per row, or aggregating in SQL (jsonb_each, GROUP BY), costs seconds on 20,000 rows."""
    import orjson
    from django.db.models import TextField
    from django.db.models.functions import Cast

    events = JobEvent.objects.filter(job_id=job_id, seq__lte=last_seq, type="metrics")
    if first_step is not None:
        events = events.filter(step__gte=first_step)
    if last_step is not None:
        events = events.filter(step__lte=last_step)
    rows = list(events.order_by("seq").annotate(text=Cast("data", TextField())).values_list("seq", "step", "text"))
    payloads: list[MetricsData] = [orjson.loads(text) for _, _, text in rows]
    steps = np.asarray([step if step is not None else seq for seq, step, _ in rows], dtype=np.float64)
    # Rows with the same keys (nearly all of a run's) become one 2-D array in one C-level conversion; a
    # per-value Python loop costs seconds on 20,000 rows of 30 numbers. None becomes NaN (a gap).
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, data in enumerate(payloads):
        groups.setdefault(tuple(data), []).append(i)
    parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for keys, members in groups.items():
        idx = np.asarray(members, dtype=np.int64)
        try:
            block = np.array([list(payloads[i].values()) for i in members], dtype=np.float64).reshape(len(members), -1)
        except (TypeError, ValueError):  # a string, a list or a nested dict among the values: one row at a time
            for i in members:
                for k, v in flat_numbers(payloads[i]).items():
                    parts.setdefault(k, []).append((np.asarray([i]), np.asarray([v], dtype=np.float64)))
            continue
        for j, key in enumerate(keys):
            parts.setdefault(key, []).append((idx, block[:, j]))
    out: Arrays = {}
    for key, pieces in parts.items():
        where = np.concatenate([p[0] for p in pieces])
        values = np.concatenate([p[1] for p in pieces])
        order = np.argsort(where, kind="stable")
        where, values = where[order], values[order]
        keep = np.isfinite(values)
        if keep.any():
            out[key] = (steps[where[keep]], values[keep])
    return out


def _resource_arrays(job_id: int, last_seq: int) -> Arrays:
    import orjson
    from django.db.models import TextField
    from django.db.models.functions import Cast

    xs: dict[str, list[float]] = {}
    ys: dict[str, list[float]] = {}
    for at, text in (JobEvent.objects.filter(job_id=job_id, seq__lte=last_seq, type="resources").order_by("seq")
                     .annotate(text=Cast("data", TextField())).values_list("time", "text")):
        data: ResourcesData = orjson.loads(text)
        for k, v in _resource_row(data).items():
            xs.setdefault(k, []).append(at)
            ys.setdefault(k, []).append(float(v))
    return {k: (np.asarray(xs[k], dtype=np.float64), np.asarray(ys[k], dtype=np.float64)) for k in xs}


def _joined(parts: list[Arrays]) -> Arrays:
    """Each key's arrays of ``parts`` (oldest first) one after the other."""
    out: Arrays = {}
    for key in {k for part in parts for k in part}:
        pieces = [part[key] for part in parts if key in part]
        out[key] = (np.concatenate([x for x, _ in pieces]), np.concatenate([y for _, y in pieces]))
    return out


def _first_step(part: Arrays) -> int | None:
    return int(min(float(x.min()) for x, _ in part.values())) if part else None


def _lineage_arrays(job_id: int, last_seq: int, ancestors: list[Ancestor], first_step: int | None,
                    last_step: int | None) -> tuple[Arrays, list[int]]:
    """The metric arrays of the ancestors (each up to its ``to_step``) then of the job, and the first step of
    each run (where each one started: the dashboard leaves start-up times out). A job with no points yet
    starts at the step after its parent's checkpoint, or at 1: the trainer numbers a step once it is done."""
    parts: list[Arrays] = []
    for a in ancestors:
        cap = a.to_step if last_step is None else min(a.to_step, last_step)
        parts.append(_metric_arrays(a.job_id, a.last_seq, first_step, cap))
    own = _metric_arrays(job_id, last_seq, first_step, last_step)
    starts = {s for s in map(_first_step, parts) if s is not None}
    own_first = _first_step(own)
    starts.add(own_first if own_first is not None else (ancestors[-1].to_step + 1 if ancestors else 1))
    return _joined([*parts, own]), sorted(starts)


def step_times(job_id: int, last_seq: int, first_step: int | None, last_step: int | None,
               points: int) -> dict[str, list[Any]]:
    """``{"x": [steps], "y": [unix times]}``: when each step's first metrics event was stored, so a chart can
    be drawn against wall time. Evenly thinned to ``points`` (time only grows: no extreme to keep)."""
    events = JobEvent.objects.filter(job_id=job_id, seq__lte=last_seq, type="metrics")
    if first_step is not None:
        events = events.filter(step__gte=first_step)
    if last_step is not None:
        events = events.filter(step__lte=last_step)
    first: dict[int, float] = {}
    for step, at in events.order_by("seq").values_list("step", "time"):
        if step is not None and step not in first:
            first[step] = float(at)
    steps = list(first)
    keep = range(len(steps)) if len(steps) <= points else np.linspace(0, len(steps) - 1, points).round().astype(int)
    return {"x": [steps[i] for i in keep], "y": [first[steps[i]] for i in keep]}


def job_series(job_id: int, last_seq: int, *, first_step: int | None = None, last_step: int | None = None,
               points: int = DEFAULT_POINTS, keys: list[str] | None = None, full: bool = True,
               ancestors: list[Ancestor] | None = None) -> dict[str, Any]:
    """The history of events ``seq <= last_seq`` in the step range: ``metrics`` and ``resources`` columns,
    and (``full``) the sample index ``[[step, seq], ...]``, the newest resources event and the log tail.
    ``keys`` (names as ``norm_key`` spells them) limits the metrics to a chart's. ``ancestors`` (oldest
    first) are the jobs a resumed job continues: their metric points come first; ``starts`` names the first
    step of each run."""
    metrics, starts = _lineage_arrays(job_id, last_seq, ancestors or [], first_step, last_step)
    if keys is not None:
        metrics = {k: v for k, v in metrics.items() if norm_key(k) in keys}
    answer: dict[str, Any] = {"last_seq": last_seq, "points": points, "metrics": downsampled(metrics, points),
                              "times": step_times(job_id, last_seq, first_step, last_step, points)}
    if not full:
        return answer
    answer["starts"] = starts
    events = JobEvent.objects.filter(job_id=job_id, seq__lte=last_seq)
    answer["resources"] = downsampled(_resource_arrays(job_id, last_seq), points)
    latest = events.filter(type="resources").order_by("-seq").first()
    answer["latest_resources"] = latest.as_message() if latest else None
    answer["samples"] = [[step, seq] for seq, step in
                         events.filter(type="samples").order_by("seq").values_list("seq", "step")]
    tail = events.filter(type__in=["status", "checkpoint", "log"]).order_by("-seq")[:LOG_TAIL]
    answer["log"] = [wire_message(e.as_message()) for e in reversed(tail)]
    return answer
