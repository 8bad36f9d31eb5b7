"""Worker-side registry tasks: they import user code, so they never run in the web process."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from celery import shared_task

from webapp.registry import actions
from webapp.registry.introspect import IntrospectionError, builtin_paths, describe, load_tool
from webapp.registry.models import Entry, Kind
from webapp.registry.sandboxes import UnknownSandbox

log = logging.getLogger(__name__)


@shared_task(name="webapp.registry.tasks.inspect_entry", acks_late=True, time_limit=120)
def inspect_entry(entry_id: int) -> str:
    """Import the entry's path, record its schema/docstring/signature/hash, or the import error."""
    entry = Entry.objects.filter(pk=entry_id).first()
    if entry is None:
        return "gone"
    try:
        description = describe(entry.kind, entry.import_path)
    except IntrospectionError as exc:
        actions.record_failure(entry_id, str(exc))
        return "failed"
    actions.record_description(entry_id, description)
    return "ready"


@shared_task(name="webapp.registry.tasks.sync_builtins", acks_late=True, time_limit=300)
def sync_builtins() -> int:
    """Make every tool and reward that ships with AgentFly appear in the registry, at its current version."""
    count = 0
    for kind, path in builtin_paths():
        entry = actions.ensure_builtin(kind, path)
        try:
            actions.record_description(entry.pk, describe(kind, path))
            count += 1
        except IntrospectionError as exc:
            actions.record_failure(entry.pk, str(exc))
    return count


@shared_task(name="webapp.registry.tasks.try_tool", acks_late=True, time_limit=120)
def try_tool(entry_id: int, arguments: Any) -> dict[str, Any]:
    """Call the tool with ``arguments`` the way a rollout would, and return its observation.

    A tool that declares a sandbox resource gets it from a resource engine built for this one call, so it
    runs inside the same sandbox it would get during training.
    """
    entry = Entry.objects.filter(pk=entry_id, kind=Kind.TOOL).first()
    if entry is None:
        return {"observation": "", "error": "this tool no longer exists", "latency": 0.0}
    try:
        tool = load_tool(entry.import_path)
        result = asyncio.run(_invoke(tool, arguments))
    except (IntrospectionError, UnknownSandbox) as exc:
        return {"observation": "", "error": str(exc), "latency": 0.0}
    return {"observation": result.observation, "error": result.error, "latency": result.latency}


async def _invoke(tool: Any, arguments: Any) -> Any:
    from agentfly.context import RolloutContext

    if not tool.resource:
        return await tool.invoke(arguments, RolloutContext(sample={}, rollout_id="try", group_id="try"))
    from agentfly.resources import ResourceEngine
    from webapp.registry.sandboxes import specs_for

    engine = ResourceEngine(specs_for([tool.resource]))
    ctx = RolloutContext(sample={}, rollout_id="try", group_id="try", resources=engine)
    try:
        return await tool.invoke(arguments, ctx)
    finally:
        try:
            await ctx.aclose()
        finally:
            await engine.aclose()


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
