"""The model servers a team's jobs may use, as the operator lists them: inference servers a job rolls out on
and syncs its weights into (``AGENTFLY_INFERENCE_SERVERS``), and judge servers its judge reward calls
(``AGENTFLY_JUDGE_SERVERS``). The launch form checks a job's servers; a worker checks them again when it
starts the job (``for_job``), since the operator may have taken one away since the launch.

A job stores a judge server by its URL alone (``judge.servers``): the served model's folder (its tokenizer)
is the operator's to say, so ``for_job`` adds the one the setting names now.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.conf import settings

INFERENCE_SETTING = "AGENTFLY_INFERENCE_SERVERS"
JUDGE_SETTING = "AGENTFLY_JUDGE_SERVERS"


class ServerRefused(ValueError):
    """A job's server is not (or no longer) one its team may use; the message names the setting."""


def inference_servers(team_slug: str) -> set[str]:
    """The inference servers team ``team_slug`` may use, as base URLs without a trailing slash."""
    by_team = getattr(settings, INFERENCE_SETTING, {}) or {}
    return {u.rstrip("/") for u in [*by_team.get("*", []), *by_team.get(team_slug, [])]}


def inference_refusal(urls: Sequence[str], team_slug: str) -> str | None:
    """Why team ``team_slug`` may not roll out on (and sync weights into) ``urls``, or None when it may."""
    allowed = inference_servers(team_slug)
    refused = [u for u in urls if u.rstrip("/") not in allowed]
    if not refused:
        return None
    offer = ", ".join(sorted(allowed)) or f"none (the operator sets {INFERENCE_SETTING})"
    return f"{', '.join(refused)} is not a server team {team_slug!r} may use; allowed: {offer}."


def judge_servers(team_slug: str) -> dict[str, str]:
    """The judge servers team ``team_slug`` may use: base URL (no trailing slash) -> the served model's folder."""
    by_team = getattr(settings, JUDGE_SETTING, {}) or {}
    listed = {**by_team.get("*", {}), **by_team.get(team_slug, {})}
    return {url.rstrip("/"): folder for url, folder in listed.items()}


def judge_servers_of_teams(slugs: Sequence[str]) -> list[str]:
    """Every judge server one of these teams may use (the launch form's choices)."""
    return sorted({url for slug in slugs for url in judge_servers(slug)})


def judge_refusal(url: str, team_slug: str) -> str | None:
    """Why team ``team_slug`` may not judge on ``url``, or None when it may."""
    allowed = judge_servers(team_slug)
    if url.rstrip("/") in allowed:
        return None
    offer = ", ".join(sorted(allowed)) or "none"
    return (f"{url} is not a judge server team {team_slug!r} may use ({JUDGE_SETTING} allows it: {offer}); "
            f"choose one of those, or ask the operator to add it to {JUDGE_SETTING}.")


def for_job(config: dict[str, Any], team_slug: str) -> dict[str, Any]:
    """``config`` as a worker runs it: its inference servers and its judge server checked against the settings
    as they are now, the judge server given the model folder its setting names for it. ``ServerRefused``
    fails the job, naming the setting."""
    reason = inference_refusal(config.get("engine_servers") or [], team_slug)
    if reason:
        raise ServerRefused(f"the job's inference servers are no longer allowed: {reason}")
    judge = config.get("judge") or {}
    if judge.get("backend") != "remote":
        return config
    urls = list(judge.get("servers") or [])
    if len(urls) != 1:
        raise ServerRefused(f"the job's judge names {len(urls)} servers; a job judges on one server of {JUDGE_SETTING}")
    reason = judge_refusal(urls[0], team_slug)
    if reason:
        raise ServerRefused(f"the job's judge server is no longer allowed: {reason}")
    url = urls[0].rstrip("/")
    return {**config, "judge": {**judge, "servers": [url], "model_dir": judge_servers(team_slug)[url]}}
