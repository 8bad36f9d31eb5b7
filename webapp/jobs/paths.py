"""Where a team's runs live on disk, and which paths a team's job may read.

    AGENTFLY_RUNS_DIR/
      <team-slug>/              one folder per team; only that team's jobs read or write in it
        job-<id>/               a job's run: config, events, checkpoint-000005/, ...
        models/tiny-<seed>/     the tiny models built on the worker for that team
      job-<id>/                 a run written before team folders: it belongs to the team of job <id>

A model, task or checkpoint path is resolved (symlinks and ``..``) and refused when it lies in the runs
folder but outside the job's own team folder: team B cannot train on team A's checkpoint, whatever path
leads there. Outside the runs folder, ``AGENTFLY_ALLOWED_PATHS`` (when set) names the shared folders a job
may read. The check runs at launch (the form, hence the API) and again on the worker when the job starts,
because a job's config can be written behind the API (the admin, a shell, an old row).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from django.conf import settings

# Task names the trainer knows without a file (trainer.config.DataConfig.task); anything else is a path.
BUILTIN_TASKS = frozenset({"arithmetic", "key_chain", "wiki_qa", "scienceworld"})
LEGACY_JOB_FOLDER = re.compile(r"job-(\d+)")


class PathRefused(ValueError):
    """A job's config names a path its team may not use."""


def team_dir(team: Any) -> Path:
    return Path(settings.AGENTFLY_RUNS_DIR) / team.slug


def job_dir(job: Any) -> Path:
    return team_dir(job.team) / f"job-{job.pk}"


def tiny_model_dir(team: Any, seed: int) -> Path:
    return team_dir(team) / "models" / f"tiny-{seed}"


def folder_owner(resolved: Path) -> str | None:
    """The slug of the team whose folder holds ``resolved`` (a resolved path): None outside the runs folder,
    "" for a place in it that is no team's (the runs folder itself, a stray folder)."""
    from webapp.jobs.models import TrainingJob

    root = Path(settings.AGENTFLY_RUNS_DIR).resolve()
    if not resolved.is_relative_to(root):
        return None
    parts = resolved.relative_to(root).parts
    if not parts:
        return ""
    legacy = LEGACY_JOB_FOLDER.fullmatch(parts[0])
    if legacy:  # team slugs never look like this (accounts.models.do_create_team), so no team can claim it
        slug = TrainingJob.objects.filter(pk=int(legacy[1])).values_list("team__slug", flat=True).first()
        return slug or ""
    return parts[0]


def refusal(raw: str, team: Any | None) -> str | None:
    """Why ``team`` may not use the path ``raw``, or None when it may."""
    resolved = Path(raw).resolve()
    own = f"your team's folder ({team_dir(team)})" if team is not None else "your team's folder"
    owner = folder_owner(resolved)
    if owner is not None:
        if team is not None and owner == team.slug:
            return None  # a team's own folder is always allowed
        return (f"{raw!r} is in AGENTFLY_RUNS_DIR ({settings.AGENTFLY_RUNS_DIR}) but outside {own}; a job may use "
                "only its own team's runs and the shared folders in AGENTFLY_ALLOWED_PATHS.")
    roots = settings.AGENTFLY_ALLOWED_PATHS
    if roots and not any(resolved.is_relative_to(Path(root).resolve()) for root in roots):
        return (f"{raw!r} is outside the folders this server allows: {', '.join(str(r) for r in roots)} "
                f"(AGENTFLY_ALLOWED_PATHS) and {own}; put the file there, or ask the operator to add its folder "
                "to AGENTFLY_ALLOWED_PATHS.")
    return None


def config_paths(config: dict[str, Any]) -> list[tuple[str, str]]:
    """Every ``(field, path)`` of a stored job config that the trainer reads or writes."""
    model, data = config.get("model") or {}, config.get("data") or {}
    found = [("model.path", model.get("path")), ("data.eval_path", data.get("eval_path")),
             ("resume_from", config.get("resume_from")), ("deepspeed", config.get("deepspeed")),
             ("sft.output_dir", (config.get("sft") or {}).get("output_dir")),
             ("sft.demos_path", (config.get("sft") or {}).get("demos_path"))]
    if data.get("task") not in BUILTIN_TASKS:
        found.append(("data.task", data.get("task")))
    return [(name, str(value)) for name, value in found if value]


def check_config(config: dict[str, Any], team: Any) -> None:
    """Raise ``PathRefused`` naming the first path of ``config`` that ``team`` may not use."""
    for name, path in config_paths(config):
        reason = refusal(path, team)
        if reason:
            raise PathRefused(f"{name}: {reason}")
