"""Where a team's runs live on disk, and which paths a team's job may read.

    AGENTFLY_RUNS_DIR/
      <team-slug>/              one folder per team; only that team's jobs read or write in it
        job-<id>/               a job's run: config, events, checkpoint-000005/, ...
        models/tiny-<seed>/     the tiny models built on the worker for that team
      job-<id>/                 a run written before team folders: it belongs to the team of job <id>

Every path of a job's config is found by its type (the trainer's config fields typed ``PathField``: model,
task, checkpoints, tracker folders and stores, and any path-like field added later), resolved (symlinks and
``..``) and refused unless it lies in the job's own team folder or in a shared folder that
``AGENTFLY_ALLOWED_PATHS`` lists (deny by default: nothing, when it is empty). Team B cannot train on team
A's checkpoint, nor point its TensorBoard log into team A's run, whatever path leads there.
``check_config`` runs at launch (the form, hence the API) and again on the worker when the job starts,
because a job's config can be written behind the API (the admin, a shell, an old row).
"""

from __future__ import annotations

import os
import re
import types
from pathlib import Path
from typing import Any

from django.conf import settings

LEGACY_JOB_FOLDER = re.compile(r"job-(\d+)")


class PathRefused(ValueError):
    """A job's config names a path its team may not use; ``key`` is the config key at fault."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


def team_dir(team: Any) -> Path:
    slug: str = team.slug
    return Path(settings.AGENTFLY_RUNS_DIR) / slug


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
    """Why ``team`` may not use the path ``raw``, or None when it may.

    Deny by default: a team's own folder is allowed, and outside the runs folder only what
    ``AGENTFLY_ALLOWED_PATHS`` lists (nothing when it is empty). The answer never depends on whether the
    path exists, so a refusal tells nobody what is on the server's disk.
    """
    own = f"your team's folder ({team_dir(team)})" if team is not None else "your team's folder"
    try:
        resolved = Path(raw).resolve()
    except (RuntimeError, OSError):  # a symbolic link that loops (ELOOP), or a name too long for the system
        # Say so only inside the team's own folder, where the team made the link; elsewhere the answer stays the
        # one a path that does not exist gets, which tells nothing about the disk.
        if team is not None and Path(os.path.abspath(raw)).is_relative_to(team_dir(team).absolute()):
            return (f"{raw!r} is a symbolic link that loops (or a path too long to resolve); give the path of the "
                    "real file or folder.")
        resolved = Path(os.path.abspath(raw))
    owner = folder_owner(resolved)
    if owner is not None:
        if team is not None and owner == team.slug:
            return None  # a team's own folder is always allowed
        return (f"{raw!r} is in AGENTFLY_RUNS_DIR ({settings.AGENTFLY_RUNS_DIR}) but outside {own}; a job may use "
                "only its own team's runs and the shared folders in AGENTFLY_ALLOWED_PATHS.")
    roots = settings.AGENTFLY_ALLOWED_PATHS
    if not any(resolved.is_relative_to(Path(root).resolve()) for root in roots):
        listed = ", ".join(str(r) for r in roots) if roots else "none set"
        return (f"{raw!r} is outside the folders this server allows (AGENTFLY_ALLOWED_PATHS: {listed}) and {own}; "
                "put the file there, or ask the operator to add its folder to AGENTFLY_ALLOWED_PATHS.")
    return None


URI_SERVERS = ("http", "https")  # a tracking server, not a place on this disk


def _path_fields(cls: type, data: dict[str, Any], prefix: str) -> list[tuple[str, str]]:
    """Every ``(key, path)`` in ``data`` (a stored mapping of the dataclass ``cls``) whose field is typed as a
    path (``trainer.config.PathField``), in nested sections, mappings and lists of them too."""
    import dataclasses
    import typing

    from trainer.config import PathField

    hints = typing.get_type_hints(cls, include_extras=True)
    found: list[tuple[str, str]] = []

    def visit(key: str, tp: Any, value: Any, siblings: dict[str, Any]) -> None:
        if value is None:
            return
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            base, *extras = typing.get_args(tp)
            for mark in extras:
                if isinstance(mark, PathField):
                    found.extend(_as_paths(key, mark, value, siblings))
                    return
            visit(key, base, value, siblings)
        elif origin in (typing.Union, types.UnionType):
            for arg in typing.get_args(tp):
                if arg is not type(None):
                    visit(key, arg, value, siblings)
        elif origin is list and isinstance(value, list):
            for i, item in enumerate(value):
                visit(f"{key}[{i}]", typing.get_args(tp)[0], item, siblings)
        elif origin is dict and isinstance(value, dict):
            for name, item in value.items():
                visit(f"{key}.{name}", typing.get_args(tp)[1], item, siblings)
        elif isinstance(tp, type) and dataclasses.is_dataclass(tp) and isinstance(value, dict):
            found.extend(_path_fields(tp, value, f"{key}."))

    for name, value in data.items():
        if name in hints:  # an unknown key is the trainer's to refuse
            visit(f"{prefix}{name}", hints[name], value, data)
    return found


def _as_paths(key: str, mark: Any, value: Any, siblings: dict[str, Any]) -> list[tuple[str, str]]:
    text = str(value)
    if mark.kind == "task":
        from agentfly.tasks import source_of

        if text in mark.names or source_of(text) is not None:
            return []  # a task's name (built in, a source, or a module's, which the registry's rules check)
    if mark.kind == "uri":
        from urllib.parse import urlparse

        scheme = urlparse(text).scheme.lower()
        if scheme in URI_SERVERS:
            return []
        if scheme == "file":
            text = urlparse(text).path
        elif scheme:
            # sqlite:///..., postgresql://... : a store the job would open itself, on this host.
            raise PathRefused(f"{key}: {text!r} is neither a tracking server (http:// or https://) nor a path "
                              "(file:/...); a job may only track to a server or into its team's folder", key)
    if mark.inside:
        base = siblings.get(mark.inside)
        text = str(Path(str(base)) / text) if base else text
    return [(key, text)]


def config_paths(config: dict[str, Any], resume_from: str = "") -> list[tuple[str, str]]:
    """Every ``(field, path)`` of a stored job config that the trainer reads or writes: each field typed as a
    path in ``trainer.config.Config``, and ``resume_from`` (the job's own column) when given."""
    from trainer.config import Config

    found = _path_fields(Config, config, "")
    if resume_from:
        found.append(("resume_from", resume_from))
    return [(name, value) for name, value in found if value]


def check_config(config: dict[str, Any], team: Any, resume_from: str = "") -> None:
    """The one check of every path in a job's config (and the checkpoint it resumes from), at launch and on
    the worker: raise ``PathRefused`` naming the first path ``team`` may not use."""
    for name, path in config_paths(config, resume_from):
        reason = refusal(path, team)
        if reason:
            raise PathRefused(f"{name}: {reason}", name)
