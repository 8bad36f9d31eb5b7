"""Run a registry entry's code in a child process of the worker: inspection and "try it".

The worker never imports a team's module itself. ``describe_in_child`` and ``try_in_child`` start this file
(``python -m webapp.registry.child``) through the resource layer's local backend (``LocalWorker``), which
gives it an environment of a few variables only (no ``SECRET_KEY``, ``DATABASE_URL``, broker or Redis URLs:
the worker's own environment is never inherited), its own working directory, and the local backend's
sandbox: a bubblewrap root holding only the Python installation, AgentFly and the web app's code, the shared
plugins and the entry's team's own plugin folder (``child_read_paths``; no host socket, no other team's
folder), rlimits (``child_limits``), no network, a private uid when the worker is root, and Landlock. Each request has a wall-clock limit (``AGENTFLY_CHILD_TIMEOUT``); past it the
child is killed. A child that exits, crashes or hangs becomes ``ChildFailed``, an error the user sees.

Protocol: the sandbox worker's JSON lines (``agentfly.resources.backends.worker``), with two requests:
``describe`` and ``try``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agentfly.resources.backends.local import Isolation, Limits, LocalWorker
from agentfly.resources.spec import ResourceError
from webapp.registry.introspect import Description, IntrospectionError
from webapp.registry.plugins import Source, visible_plugin_paths

ROOT = Path(__file__).resolve().parents[2]  # holds the agentfly and webapp packages the child imports


class ChildFailed(IntrospectionError):
    """The child process exited, crashed, was killed or timed out; the message is shown to the user."""


def child_limits(timeout: float) -> Limits:
    """Room for a tool's imports and a sandbox or two of its own, and CPU time just past the wall clock."""
    return Limits(cpu_seconds=int(timeout) + 30, memory_bytes=4 << 30, open_files=256, file_size_bytes=64 << 20,
                  processes=64)


def _settings() -> tuple[list[str], float]:
    from django.conf import settings

    return [str(Path(d).resolve()) for d in settings.AGENTFLY_PLUGIN_DIRS], float(settings.AGENTFLY_CHILD_TIMEOUT)


def child_read_paths(plugin_dirs: list[str], team_slug: str | None) -> list[str]:
    """What a child of team ``team_slug`` reads besides the Python installation (``local.sandbox_view`` adds
    that and its working folder; nothing else exists in its root): AgentFly and the web app's code, the
    shared plugin modules and the team's own plugin folder. Another team's folder is not there at all."""
    import agentfly
    from webapp.accounts.models import Team

    code = [str(Path(agentfly.__file__).resolve().parent), str(ROOT / "webapp")]
    slugs = Team.objects.values_list("slug", flat=True)
    return [*code, *visible_plugin_paths(plugin_dirs, team_slug, slugs)]


async def _run(requests: list[dict[str, Any]], plugin_dirs: list[str], timeout: float,
               read_paths: list[str]) -> list[dict[str, Any]]:
    worker = LocalWorker(
        [sys.executable, "-P", "-m", "webapp.registry.child"],
        limits=child_limits(timeout),
        isolation=Isolation(network="none", filesystem="restricted", own_uid=True, read_paths=tuple(read_paths)),
        env={"PYTHONPATH": str(ROOT)},
    )
    replies = []
    try:
        try:
            await worker.start()
        except (ResourceError, TimeoutError) as exc:
            raise ChildFailed(f"the child process that runs the code did not start: {exc}") from None
        for request in requests:
            try:
                replies.append(await worker.request({**request, "plugin_dirs": plugin_dirs}, timeout))
            except TimeoutError:
                raise ChildFailed(f"the code ran past {timeout:g} s and was stopped (AGENTFLY_CHILD_TIMEOUT)") from None
            except ResourceError as exc:
                # "sandbox process exited (exit code 3)", "killed by SIGSEGV: segmentation fault", ...
                raise ChildFailed(f"the code's process ended: {str(exc).removeprefix('sandbox process ')}") from None
    finally:
        await worker.close()
    return replies


def run_in_child(requests: list[dict[str, Any]], team_slug: str | None = None) -> list[dict[str, Any]]:
    """Answer ``requests`` in one fresh child process of team ``team_slug`` (None: a built-in entry), which
    sees the shared plugins and that team's folder only (worker side; needs Django settings)."""
    plugin_dirs, timeout = _settings()
    return asyncio.run(_run(requests, plugin_dirs, timeout, child_read_paths(plugin_dirs, team_slug)))


def _request(op: str, kind: str, import_path: str, source: Source, **extra: Any) -> dict[str, Any]:
    return {"op": op, "kind": kind, "import_path": import_path, "source": asdict(source), **extra}


def describe_in_child(kind: str, import_path: str, source: Source, team_slug: str | None = None) -> Description:
    """``introspect.describe`` of the entry, run in a child; IntrospectionError says why it failed."""
    (reply,) = run_in_child([_request("describe", kind, import_path, source)], team_slug)
    if not reply.get("ok"):
        raise IntrospectionError(reply.get("error") or "the inspection failed")
    return Description(**reply["description"])


def try_in_child(import_path: str, source: Source, arguments: Any, team_slug: str | None = None) -> dict[str, Any]:
    """Call the tool with ``arguments`` in a child of team ``team_slug``: ``{"observation", "error", "latency"}``."""
    try:
        (reply,) = run_in_child([_request("try", "tool", import_path, source, arguments=arguments)], team_slug)
    except IntrospectionError as exc:
        return {"observation": "", "error": str(exc), "latency": 0.0}
    if not reply.get("ok"):
        return {"observation": "", "error": reply.get("error") or "the call failed", "latency": 0.0}
    return {"observation": reply["observation"], "error": reply["error"], "latency": reply["latency"]}


# ------------------------------------------------------------------------------------ the child's side
async def invoke(tool: Any, arguments: Any) -> Any:
    """Call the tool the way a rollout would. A tool that declares a sandbox resource gets it from a resource
    engine built for this one call, so it runs inside the same sandbox it would get during training."""
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


def _handlers() -> dict[str, Any]:
    from webapp.registry import introspect
    from webapp.registry.sandboxes import UnknownSandbox

    def source_of(req: dict[str, Any]) -> Source:
        return Source(**req["source"])

    def do_describe(req: dict[str, Any]) -> dict[str, Any]:
        try:
            found = introspect.describe(req["kind"], req["import_path"], source_of(req), req["plugin_dirs"])
        except IntrospectionError as exc:
            return {"ok": False, "error": str(exc)}
        return {"ok": True, "description": asdict(found)}

    def do_try(req: dict[str, Any]) -> dict[str, Any]:
        try:
            tool = introspect.load("tool", req["import_path"], source_of(req), req["plugin_dirs"])
            result = asyncio.run(invoke(tool, req["arguments"]))
        except (IntrospectionError, UnknownSandbox) as exc:
            return {"ok": False, "error": str(exc)}
        return {"ok": True, "observation": result.observation, "error": result.error, "latency": result.latency}

    return {"describe": do_describe, "try": do_try}


def main() -> None:
    from agentfly.resources.backends.worker import Channel, harden, receive_identity, serve

    channel = Channel()
    config = json.loads(os.environ.pop("AGENTFLY_SANDBOX", "{}"))
    os.chdir(config.get("workdir") or os.getcwd())
    # Import the trusted code now, while every file is readable: once hardened, the child reads only the
    # Python installation, AgentFly and the plugin folders.
    import agentfly.context
    import agentfly.resources
    import agentfly.rewards
    import agentfly.tools  # noqa: F401

    handlers = _handlers()
    try:
        receive_identity(channel, config)
        report = harden(config)
    except Exception as exc:  # never run user code half-isolated
        channel.write({"ok": False, "ready": False, "error": f"isolation failed: {type(exc).__name__}: {exc}"})
        return
    channel.write({"ok": True, "ready": True, "pid": os.getpid(), "isolation": report})
    serve(channel, handlers)


if __name__ == "__main__":
    main()
