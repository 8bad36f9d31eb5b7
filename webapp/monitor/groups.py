"""Runs drawn as a group: several runs' curves of one metric as their mean with a band (the sample standard
deviation, or the min and max), and each run's own curve, for the compare page's seed groups and a sweep's page.

The runs are aligned by step. Where a run has more steps than a chart needs, the steps are cut into at most
``points`` equal buckets and each run's values in a bucket are averaged first, so every run weighs the same
in a bucket whatever its logging rate; ``n`` says how many runs a point averages (a run that ended early
leaves the later points to the others, and says so).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from webapp.monitor.series import _metric_arrays, minmax_indices, norm_key

BANDS = ("std", "minmax")


def metric_curve(job: Any, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """``job``'s (steps, values) of ``metric`` (named as the trainer or ``norm_key`` spells it); empty if none."""
    for key, (steps, values) in _metric_arrays(job.pk, job.last_seq, None, None).items():
        if key == metric or norm_key(key) == metric:
            return steps, values
    return np.empty(0), np.empty(0)


def metric_names(jobs: list[Any]) -> list[str]:
    """The metric names any of ``jobs`` reported, sorted."""
    names: set[str] = set()
    for job in jobs:
        names.update(_metric_arrays(job.pk, job.last_seq, None, None))
    return sorted(names)


def band(curves: list[tuple[np.ndarray, np.ndarray]], kind: str = "std", points: int = 300) -> dict[str, list[Any]]:
    """The mean of ``curves`` per step (or per bucket of steps) and its band: ``x``, ``mean``, ``lower``,
    ``upper``, ``n``. ``kind`` "std" draws mean ± the sample std (0 where one run reports), "minmax" the
    smallest and largest run."""
    if kind not in BANDS:
        raise ValueError(f"Unknown band: {kind!r}; use one of {', '.join(BANDS)}")
    curves = [(s, v) for s, v in curves if len(s)]
    if not curves:
        return {"x": [], "mean": [], "lower": [], "upper": [], "n": []}
    steps = np.unique(np.concatenate([s for s, _ in curves]))
    if len(steps) > points:  # equal buckets of steps; a bucket's x is the mean step it holds
        edges = np.linspace(steps[0], steps[-1], points + 1)
        edges[-1] = np.inf
    else:
        edges = np.append(steps, np.inf)
    per_run = np.full((len(curves), len(edges) - 1), np.nan)
    x_sum, x_count = np.zeros(len(edges) - 1), np.zeros(len(edges) - 1)
    for i, (s, v) in enumerate(curves):
        where = np.searchsorted(edges, s, side="right") - 1
        sums = np.bincount(where, weights=v, minlength=len(edges) - 1)
        counts = np.bincount(where, minlength=len(edges) - 1)
        with np.errstate(invalid="ignore", divide="ignore"):
            per_run[i] = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
        x_sum += np.bincount(where, weights=s, minlength=len(edges) - 1)
        x_count += counts
    keep = x_count > 0
    per_run, x = per_run[:, keep], x_sum[keep] / x_count[keep]
    n = np.sum(~np.isnan(per_run), axis=0)
    mean = np.nanmean(per_run, axis=0)
    if kind == "std":
        with warnings.catch_warnings():  # one run at a point: its std is undefined, drawn as no band
            warnings.simplefilter("ignore", RuntimeWarning)
            std = np.nanstd(per_run, axis=0, ddof=1)
        spread = np.where(n > 1, std, 0.0)
        lower, upper = mean - spread, mean + spread
    else:
        lower, upper = np.nanmin(per_run, axis=0), np.nanmax(per_run, axis=0)
    return {"x": x.tolist(), "mean": mean.tolist(), "lower": lower.tolist(), "upper": upper.tolist(),
            "n": n.astype(int).tolist()}


def run_curve(steps: np.ndarray, values: np.ndarray, points: int = 300) -> dict[str, list[float]]:
    """One run's curve for a chart: its points, min and max of each bucket past ``points`` (``series``)."""
    keep = minmax_indices(values, points)
    return {"x": steps[keep].tolist(), "y": values[keep].tolist()}
