"""A job's judge: the model that its judge reward calls (``@reward(resource="judge")``), in the worker or on
a judge server the operator allows the team (``AGENTFLY_JUDGE_SERVERS``).

A job stores what the user chose: a judge on a model directory as ``judge.model_dir``, a judge server as
``judge.servers`` alone. The server's model folder (its tokenizer) is the operator's to say, so the setting
supplies it when a worker starts the job (``for_job``), after checking the server is still allowed: the
operator may have taken it away since the launch.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

SETTING = "AGENTFLY_JUDGE_SERVERS"
# Where a job's judge runs (the launch form's ``judge_source``); "" is no judge.
SOURCES = (("", "No judge"), ("policy", "The job's starting model (a frozen copy, in the worker)"),
           ("path", "A model directory (in the worker)"), ("server", "A judge server the operator allows"))
# The rubric goes into every judge prompt, whose room is the judge model's context less its verdict.
RUBRIC_MAX_CHARS = 2000


class JudgeRefused(ValueError):
    """A job's judge server is not (or no longer) one its team may use; the message names the setting."""


def allowed_servers(team_slug: str) -> dict[str, str]:
    """The judge servers team ``team_slug`` may use: base URL (no trailing slash) -> the served model's folder."""
    by_team = getattr(settings, SETTING, {}) or {}
    listed = {**by_team.get("*", {}), **by_team.get(team_slug, {})}
    return {url.rstrip("/"): folder for url, folder in listed.items()}


def servers_of_teams(slugs: list[str]) -> list[str]:
    """Every judge server one of these teams may use (the launch form's choices)."""
    return sorted({url for slug in slugs for url in allowed_servers(slug)})


def refusal(url: str, team_slug: str) -> str | None:
    """Why team ``team_slug`` may not judge on ``url``, or None when it may."""
    allowed = allowed_servers(team_slug)
    if url.rstrip("/") in allowed:
        return None
    offer = ", ".join(sorted(allowed)) or "none"
    return (f"{url} is not a judge server team {team_slug!r} may use ({SETTING} allows it: {offer}); choose one "
            f"of those, or ask the operator to add it to {SETTING}.")


def server_config(url: str, rubric: str | None, team_slug: str) -> dict[str, Any]:
    """The ``judge`` section of a job judged on server ``url``, with the model folder the setting names for
    it now: what the trainer gets (``for_job``), and what the launch form validates."""
    reason = refusal(url, team_slug)
    if reason:
        raise JudgeRefused(reason)
    return {"backend": "remote", "servers": [url.rstrip("/")], "model_dir": allowed_servers(team_slug)[url.rstrip("/")],
            **({"rubric": rubric} if rubric else {})}


def for_job(config: dict[str, Any], team_slug: str) -> dict[str, Any]:
    """``config`` as a worker runs it: a judge server checked against the setting as it is now and given the
    model folder the setting names for it. ``JudgeRefused`` fails the job, naming the setting."""
    judge = config.get("judge") or {}
    if judge.get("backend") != "remote":
        return config
    servers = list(judge.get("servers") or [])
    if len(servers) != 1:
        raise JudgeRefused(f"the job's judge names {len(servers)} servers; a job judges on one server of {SETTING}")
    try:
        resolved = server_config(servers[0], None, team_slug)
    except JudgeRefused as exc:
        raise JudgeRefused(f"the job's judge server is no longer allowed: {exc}") from None
    return {**config, "judge": {**judge, **resolved}}
