"""A coding agent's tools: ``bash``, ``read_file``, ``write_file``, ``apply_patch`` and ``run_tests``, all on the
rollout's workspace (``agentfly.resources.workspace.Workspace``: a repository in a sandbox).

``WORKSPACE`` is the pool these tools use (the trainer and the web app take it from here). The first call of a
rollout prepares its workspace from the task sample's ``files`` (a git repository of them, committed); in a
GRPO group the rollouts instead get forks of one workspace prepared once (``ResourceEngine.fork_group``)::

    agent = af.Agent(model, tools=[bash, read_file, write_file, run_tests],
                     resources=af.ResourceEngine([WORKSPACE]))

Every tool counts what it did on the workspace (``edits``, ``test_runs``), which the code-repair reward
reports per episode.
"""

from __future__ import annotations

from typing import Any

from agentfly.resources.builtin import register_builtin
from agentfly.resources.spec import Pool, ResourceSpec
from agentfly.resources.workspace import RESOURCE, Workspace
from agentfly.tools.tool import tool

# Prepared workspaces (one per group when groups fork); each holds files only, no process between commands.
WORKSPACE = register_builtin(ResourceSpec(name=RESOURCE, factory=Workspace, kind="sandbox", pool=Pool(min=0, max=16),
                                          acquire_timeout=60))


async def workspace_of(context: Any) -> Workspace:
    """The rollout's workspace, prepared for its task sample (once: a fork comes prepared)."""
    ws: Workspace = await context.resource(RESOURCE)
    if ws.prepared is None:
        await ws.prepare_sample(context.sample)
    return ws


@tool(resource=RESOURCE, timeout=120)
async def bash(command: str, context: Any) -> str:
    """Run a bash command in the repository and return its output. The working directory is kept between calls;
    each call may run at most 30 seconds, and nothing it starts outlives it.

    Args:
        command: the command line, e.g. "ls", "grep -n def src/*.py", "git diff", "python -m pytest -q".
    """
    ws = await workspace_of(context)
    await ws.tally("commands")
    return (await ws.sh(command)).observation()


@tool(resource=RESOURCE, timeout=60)
async def read_file(path: str, context: Any) -> str:
    """Show a file of the repository.

    Args:
        path: the file's path, relative to the working directory (or absolute, under /workspace).
    """
    ws = await workspace_of(context)
    await ws.tally("reads")
    return await ws.read_file(path)


@tool(resource=RESOURCE, timeout=60)
async def write_file(path: str, content: str, context: Any) -> str:
    """Replace a file's whole content (or create it).

    Args:
        path: the file's path, relative to the working directory (or absolute, under /workspace).
        content: the file's new text, complete.
    """
    ws = await workspace_of(context)
    await ws.tally("edits")
    await ws.write_file(path, content)
    return f"wrote {len(content.encode())} bytes to {path}"


@tool(resource=RESOURCE, timeout=60)
async def apply_patch(patch: str, context: Any) -> str:
    """Apply a unified diff to the repository (as `git apply` takes it: paths relative to the repository's top).

    Args:
        patch: the diff, with ---/+++ file headers and @@ hunks.
    """
    ws = await workspace_of(context)
    await ws.tally("edits")
    return (await ws.apply_patch(patch)).observation()


@tool(resource=RESOURCE, timeout=180)
async def run_tests(context: Any) -> str:
    """Run the project's unit tests and return their report (which tests fail, and why)."""
    ws = await workspace_of(context)
    await ws.tally("test_runs")
    return (await ws.run_tests()).observation()


__all__ = ["RESOURCE", "WORKSPACE", "apply_patch", "bash", "read_file", "run_tests", "workspace_of", "write_file"]
