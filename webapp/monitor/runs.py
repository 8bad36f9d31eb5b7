"""Runs compared by their settings: the compare page's config-diff table, hyperparameter table with final
metrics, and runs that differ only by seed grouped into mean ± std.

Pure functions of the jobs' stored configs and final metrics (``TrainingJob.config``, ``final_metrics``), so
the tables read the same as the launch form wrote them.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

# The settings a researcher compares runs by, as config keys, with their column titles.
HYPERPARAMETERS = (
    ("algorithm.name", "algorithm"), ("data.task", "task"), ("optim.lr", "lr"), ("rollout.group_size", "group"),
    ("rollout.prompts_per_step", "prompts"), ("rollout.temperature", "temperature"), ("rollout.max_turns", "turns"),
    ("steps", "steps"), ("seed", "seed"),
)
# The final metrics shown next to them (the trainer's names), the first present ones.
FINAL_METRICS = ("eval/accuracy", "eval/pass@1", "eval/reward/mean", "reward/mean", "accuracy", "time/train")
# Keys that change with the seed alone: the seed itself, and what the form derives from it.
SEED_KEYS = frozenset({"seed", "data.seed", "model.tiny_seed"})


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """``{"rollout": {"group_size": 4}}`` -> ``{"rollout.group_size": 4}`` (lists and scalars are leaves)."""
    if not isinstance(config, dict):
        return {prefix.rstrip("."): config} if prefix else {}
    out: dict[str, Any] = {}
    for key, value in config.items():
        out |= flatten(value, f"{prefix}{key}.") if isinstance(value, dict) and value else {f"{prefix}{key}": value}
    return out


def config_diff(configs: list[dict[str, Any]]) -> list[tuple[str, list[Any]]]:
    """``(key, [value per config])`` for every key whose value is not the same in all of them, sorted by key;
    a key a config lacks is None there."""
    flat = [flatten(c) for c in configs]
    keys = sorted(set().union(*flat)) if flat else []
    return [(k, [f.get(k) for f in flat]) for k in keys if len({repr(f.get(k)) for f in flat}) > 1]


def _seed_free(config: dict[str, Any]) -> str:
    flat = flatten(config)
    tiny = bool(flat.get("model.build_tiny"))
    return repr(sorted((k, repr(v)) for k, v in flat.items()
                       if k not in SEED_KEYS and not (tiny and k == "model.path")))  # a tiny model's path names its seed


def metric_names(finals: list[dict[str, Any]]) -> list[str]:
    return [m for m in FINAL_METRICS if any(isinstance(f.get(m), (int, float)) for f in finals)]


def seed_groups(jobs: list[Any]) -> list[dict[str, Any]]:
    """Jobs whose configs differ only by seed, each group with ≥ 2 runs: its jobs and, per final metric,
    ``(mean, std)`` over the runs that report it (sample std; 0 for one run)."""
    by_config: dict[str, list[Any]] = {}
    for job in jobs:
        by_config.setdefault(_seed_free(job.config if isinstance(job.config, dict) else {}), []).append(job)
    groups = []
    for members in by_config.values():
        if len(members) < 2:
            continue
        finals = [j.final_metrics or {} for j in members]
        stats = {}
        for name in metric_names(finals):
            values = [float(f[name]) for f in finals if isinstance(f.get(name), (int, float)) and math.isfinite(f[name])]
            if values:
                stats[name] = (statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0, len(values))
        groups.append({"jobs": members, "seeds": [j.config.get("seed") for j in members], "stats": stats})
    return groups


def hyperparameter_rows(jobs: list[Any]) -> tuple[list[str], list[str], list[tuple[Any, list[Any], list[Any]]]]:
    """The hyperparameter table: column titles, metric names, and per job ``(job, [settings], [final metrics])``."""
    finals = [j.final_metrics or {} for j in jobs]
    metrics = metric_names(finals)
    rows = []
    for job, final in zip(jobs, finals, strict=True):
        flat = flatten(job.config if isinstance(job.config, dict) else {})
        rows.append((job, [flat.get(k) for k, _ in HYPERPARAMETERS], [final.get(m) for m in metrics]))
    return [title for _, title in HYPERPARAMETERS], metrics, rows
