"""Launching a sweep: expand the space into runs, validate each run as the launch form would, and launch them
all or none, within the team's quota.

Each run starts from a job's launch settings (the form's "clone job", ``initial_from_job``) with the swept
fields replaced, and goes through ``LaunchForm`` and ``do_launch_job`` like a launch from the page, so every
launch rule holds for every run. The team's row is locked while the runs are counted and created, so the
sweep fits the concurrent-jobs quota whole or is refused, never half-launched.
"""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

from django.conf import settings
from django.db import transaction

from webapp.accounts.models import Team
from webapp.jobs import actions as job_actions
from webapp.jobs.models import ACTIVE, TrainingJob, quotas_of
from webapp.sweeps.models import Kind, Sweep, SweepRun

# Launch fields a sweep may vary: the numbers and choices of a run, never its team, model or data.
SWEEPABLE = ("learning_rate", "seed", "temperature", "group_size", "prompts_per_step", "max_turns", "max_new_tokens",
             "steps", "algorithm", "loss_agg", "eval_size", "save_every", "sft_learning_rate", "max_staleness")


class SweepRefused(ValueError):
    """The sweep cannot be launched; the message names the field or run at fault and how to fix it."""


def expand(kind: str, space: dict[str, Any], count: int = 0, seed: int = 0) -> list[dict[str, Any]]:
    """The runs of a sweep: every combination of the lists (grid), or ``count`` draws (random), each a
    ``{field: value}``; SweepRefused names what is wrong with ``space``."""
    limit = settings.AGENTFLY_SWEEP_MAX_RUNS
    if not isinstance(space, dict) or not space:
        raise SweepRefused('fields must name at least one launch field and its values, e.g. '
                           '{"learning_rate": [1e-4, 3e-4], "seed": [0, 1, 2]}')
    unknown = sorted(set(space) - set(SWEEPABLE))
    if unknown:
        raise SweepRefused(f"{', '.join(unknown)} cannot be swept; sweep some of: {', '.join(SWEEPABLE)}")
    for name, values in space.items():
        ranged = isinstance(values, dict)
        if ranged and kind != Kind.RANDOM:
            raise SweepRefused(f"{name}: a range ({{min, max}}) needs a random sweep; give a grid a list of values")
        if ranged and not (isinstance(values.get("min"), (int, float)) and isinstance(values.get("max"), (int, float))
                           and values["min"] <= values["max"] and not (values.get("log") and values["min"] <= 0)):
            raise SweepRefused(f"{name}: a range needs numbers min <= max (and min > 0 with log)")
        if not ranged and (not isinstance(values, list) or not values or len(values) > limit
                           or not all(isinstance(v, (int, float, str)) and not isinstance(v, bool) for v in values)):
            raise SweepRefused(f"{name}: give a list of 1 to {limit} numbers or names, e.g. [1e-4, 3e-4]")
    if kind == Kind.GRID:
        total = math.prod(len(v) for v in space.values())
        if total > limit:
            raise SweepRefused(f"the grid has {total} runs, more than {limit} (AGENTFLY_SWEEP_MAX_RUNS); sweep "
                               "fewer values, or draw a random sweep")
        return [dict(zip(space, combo, strict=True)) for combo in itertools.product(*space.values())]
    if kind == Kind.RANDOM:
        if not 1 <= count <= limit:
            raise SweepRefused(f"count must be 1 to {limit} (AGENTFLY_SWEEP_MAX_RUNS) for a random sweep")
        rng = random.Random(seed)
        return [{name: _draw(rng, values) for name, values in space.items()} for _ in range(count)]
    raise SweepRefused(f"Unknown kind: {kind!r}; use 'grid' or 'random'")


def _draw(rng: random.Random, values: Any) -> Any:
    if isinstance(values, list):
        return rng.choice(values)
    low, high = float(values["min"]), float(values["max"])
    x = math.exp(rng.uniform(math.log(low), math.log(high))) if values.get("log") else rng.uniform(low, high)
    return round(x) if values.get("integer") else float(f"{x:.6g}")


def run_forms(user: object, base: TrainingJob, name: str, runs: list[dict[str, Any]]) -> list[Any]:
    """One valid launch form per run; SweepRefused names the first run the launch rules refuse and why."""
    from webapp.jobs.forms import LaunchForm, initial_from_job

    base_data = {k: v for k, v in initial_from_job(base).items() if v is not None}
    forms = []
    for i, params in enumerate(runs, 1):
        data = {**base_data, **params, "name": f"{name} #{i}"[:100], "launch_key": ""}
        form = LaunchForm(data, user=user)
        if not form.is_valid():
            errors = "; ".join(f"{field}: {' '.join(msgs)}" for field, msgs in form.errors.items())
            raise SweepRefused(f"run {i} ({', '.join(f'{k}={v}' for k, v in params.items())}) is refused: {errors}")
        forms.append(form)
    return forms


def do_launch_sweep(*, user: object, base: TrainingJob, name: str, kind: str, space: dict[str, Any], count: int = 0,
                    seed: int = 0, metric: str = "eval/accuracy", goal: str = "max") -> Sweep:
    """Launch every run of the sweep as a queued job of ``base``'s team, or none: SweepRefused for a bad space
    or run, QuotaExceeded when the runs do not fit the team's concurrent-jobs quota."""
    team: Team = base.team
    if not team.has_member(user):
        raise PermissionError("you can only sweep jobs of a team you belong to")
    runs = expand(kind, space, count, seed)
    forms = run_forms(user, base, name, runs)
    with transaction.atomic():
        Team.objects.select_for_update().filter(pk=team.pk).first()
        active = TrainingJob.objects.filter(team=team, status__in=ACTIVE).count()
        allowed = quotas_of(team).concurrent_jobs
        if active + len(runs) > allowed:
            raise job_actions.QuotaExceeded(
                f"the sweep's {len(runs)} runs do not fit team {team.name}'s quota of {allowed} concurrent jobs "
                f"(concurrent_jobs; {active} are queued or running now): sweep at most {max(allowed - active, 0)} "
                "runs, wait for jobs to finish, or ask an operator to raise the quota")
        sweep = Sweep.objects.create(team=team, created_by=user, name=name, kind=kind, space=space, count=count,
                                     seed=seed, metric=metric, goal=goal, base_job=base)
        for params, form in zip(runs, forms, strict=True):
            job, _ = form.launch(user)  # the one launch path of the page and the API (no launch key: each run is new)
            SweepRun.objects.create(sweep=sweep, job=job, params=params)
    return sweep


def run_value(job: TrainingJob, metric: str) -> float | None:
    """A run's value of ``metric``: its final metric, else the last value it reported (a running job)."""
    final = (job.final_metrics or {}).get(metric)
    if isinstance(final, (int, float)) and math.isfinite(final):
        return float(final)
    from webapp.monitor.groups import metric_curve

    _, values = metric_curve(job, metric)
    return float(values[-1]) if len(values) else None


def best_run(values: dict[int, float | None], goal: str) -> int | None:
    """The job id with the best value (``goal`` "max" or "min"); None when no run reported the metric."""
    scored = {k: v for k, v in values.items() if v is not None}
    if not scored:
        return None
    return (max if goal == "max" else min)(scored, key=lambda k: scored[k])
