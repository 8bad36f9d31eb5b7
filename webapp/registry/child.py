"""Run a registry entry's code in a child process of the worker: inspection and "try it".

The worker never imports a team's module itself. ``describe_in_child`` and ``try_in_child`` start this file
(``python -m webapp.registry.child``) through the resource layer's local backend (``LocalWorker``), which
gives it an environment of a few variables only (no ``SECRET_KEY``, ``DATABASE_URL``, broker or Redis URLs:
the worker's own environment is never inherited), its own working directory, and the sandbox hardening of
``agentfly/resources/backends/_worker.py``: rlimits (``CHILD_LIMITS``), no network, a private uid when the
worker is root, and Landlock (read the Python installation, AgentFly and the plugin folders; write only
the working directory). Each request has a wall-clock limit (``AGENTFLY_CHILD_TIMEOUT``); past it the
child is killed. A child that exits, crashes or hangs becomes ``ChildFailed``, an error the user sees.

Protocol: the ``_worker.py`` JSON lines, with two requests: ``describe`` and ``try``.
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
from webapp.registry.plugins import Source

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


async def _run(requests: list[dict[str, Any]], plugin_dirs: list[str], timeout: float) -> list[dict[str, Any]]:
    import agentfly

    worker = LocalWorker(
        [sys.executable, "-P", "-m", "webapp.registry.child"],
        limits=child_limits(timeout),
        isolation=Isolation(network="none", filesystem="restricted", own_uid=True,
                            read_paths=(str(Path(agentfly.__file__).resolve().parent), *plugin_dirs)),
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


def run_in_child(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Answer ``requests`` in one fresh child process (worker side; needs Django settings)."""
    plugin_dirs, timeout = _settings()
    return asyncio.run(_run(requests, plugin_dirs, timeout))


def _request(op: str, kind: str, import_path: str, source: Source, **extra: Any) -> dict[str, Any]:
    return {"op": op, "kind": kind, "import_path": import_path, "source": asdict(source), **extra}


def describe_in_child(kind: str, import_path: str, source: Source) -> Description:
    """``introspect.describe`` of the entry, run in a child; IntrospectionError says why it failed."""
    (reply,) = run_in_child([_request("describe", kind, import_path, source)])
    if not reply.get("ok"):
        raise IntrospectionError(reply.get("error") or "the inspection failed")
    return Description(**reply["description"])


def try_in_child(import_path: str, source: Source, arguments: Any) -> dict[str, Any]:
    """Call the tool with ``arguments`` in a child: ``{"observation", "error", "latency"}``."""
    try:
        (reply,) = run_in_child([_request("try", "tool", import_path, source, arguments=arguments)])
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
            tool = introspect.load_tool(req["import_path"], source_of(req), req["plugin_dirs"])
            result = asyncio.run(invoke(tool, req["arguments"]))
        except (IntrospectionError, UnknownSandbox) as exc:
            return {"ok": False, "error": str(exc)}
        return {"ok": True, "observation": result.observation, "error": result.error, "latency": result.latency}

    return {"describe": do_describe, "try": do_try}


def main() -> None:
    from agentfly.resources.backends import _worker

    channel = _worker.Channel()
    config = json.loads(os.environ.pop("AGENTFLY_SANDBOX", "{}"))
    os.chdir(config.get("workdir") or os.getcwd())
    # Import the trusted code now, while every file is readable: once hardened, the child reads only the
    # Python installation, AgentFly and the plugin folders.
    import agentfly.context
    import agentfly.resources
    import agentfly.rewards
    import agentfly.tools  # noqa: F401

    handlers = _handlers()
    # A tool's own sandbox (python_code's) is started from here, with its stderr on /dev/null.
    config["write_paths"] = [*config.get("write_paths", []), os.devnull]
    try:
        report = _worker.harden(config)
    except Exception as exc:  # never run user code half-isolated
        channel.write({"ok": False, "ready": False, "error": f"isolation failed: {type(exc).__name__}: {exc}"})
        return
    channel.write({"ok": True, "ready": True, "pid": os.getpid(), "isolation": report})
    _worker.serve(channel, handlers)


if __name__ == "__main__":
    main()
