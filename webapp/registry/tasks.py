"""Worker-side registry tasks: they run user code, so they never run in the web process.

Each checks the registry's rule (``rules.check_registrable``) before anything is imported, and runs the
entry's code in a child process (``webapp.registry.child``), so user code can neither end the worker nor
read its environment. None of them is redelivered: they are acknowledged when they start
(``acks_late=False``), so a worker process that dies while running one drops it instead of taking it again
(the app's ``task_acks_late`` + ``task_reject_on_worker_lost`` are for training jobs, which claim their row).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from celery import shared_task

from webapp.registry import worker
from webapp.registry.child import describe_in_child, try_in_child
from webapp.registry.introspect import IntrospectionError, builtin_paths, describe
from webapp.registry.models import Entry, Kind
from webapp.registry.rules import NotRegistrable, check_registrable

log = logging.getLogger(__name__)
# Acknowledged on receipt: a crash while one runs is reported (to the user, or as a failed entry), never
# answered by running the same code again.
ONCE = {"acks_late": False, "reject_on_worker_lost": False}


def team_slug(entry: Entry) -> str | None:
    return entry.team.slug if entry.team_id else None  # type: ignore[union-attr]


@shared_task(name="webapp.registry.tasks.inspect_entry", time_limit=120, **ONCE)
def inspect_entry(entry_id: int) -> str:
    """Import the entry's path, record its schema/docstring/signature/hash, or the import error."""
    entry = Entry.objects.select_related("team").filter(pk=entry_id).first()
    if entry is None:
        return "gone"
    try:
        source = check_registrable(entry.kind, entry.import_path, team_slug(entry))
        description = describe_in_child(entry.kind, entry.import_path, source, team_slug(entry))
    except (NotRegistrable, IntrospectionError) as exc:
        worker.record_failure(entry_id, str(exc))
        return "failed"
    worker.record_description(entry_id, description)
    return "ready"


@shared_task(name="webapp.registry.tasks.sync_builtins", time_limit=300, **ONCE)
def sync_builtins() -> int:
    """Make every tool and reward that ships with AgentFly appear in the registry, at its current version.

    Built-ins are AgentFly's own code, already imported by the worker: they are described in this process
    (a child per worker start would cost seconds for no isolation gained), after the same rule check.
    """
    count = 0
    for kind, path in builtin_paths():
        entry = worker.ensure_builtin(kind, path)
        try:
            worker.record_description(entry.pk, describe(kind, path, check_registrable(kind, path, None)))
            count += 1
        except (NotRegistrable, IntrospectionError) as exc:
            worker.record_failure(entry.pk, str(exc))
    return count


@shared_task(name="webapp.registry.tasks.try_tool", time_limit=120, **ONCE)
def try_tool(entry_id: int, arguments: Any, slot: dict[str, Any] | None = None) -> dict[str, Any]:
    """Call the tool with ``arguments`` the way a rollout would (in a child), and return its observation.

    ``slot`` is the caller's place in the "try it" pool (``webapp.registry.trying``): given back here, when the
    call has really ended, so a call its user stopped waiting for still counts while it runs.
    """
    from webapp.registry.tryslots import release_slot

    try:
        entry = Entry.objects.select_related("team").filter(pk=entry_id, kind=Kind.TOOL).first()
        if entry is None:
            return {"observation": "", "error": "this tool no longer exists", "latency": 0.0}
        try:
            source = check_registrable(entry.kind, entry.import_path, team_slug(entry))
        except NotRegistrable as exc:
            return {"observation": "", "error": str(exc), "latency": 0.0}
        return try_in_child(entry.import_path, source, arguments, team_slug(entry))
    finally:
        release_slot(slot)


def parse_arguments(text: str) -> dict[str, Any]:
    """The JSON object a user typed into the "try it" form; ValueError names the problem."""
    from webapp.inputs import loads

    try:
        value = loads(text or "{}")  # refuses deep nesting and NUL/surrogates with a ValueError of its own
    except json.JSONDecodeError as exc:
        raise ValueError(f"arguments are not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if not isinstance(value, dict):
        raise ValueError(f"arguments must be a JSON object like {{\"expression\": \"1+2\"}}, got {type(value).__name__}")
    return value
