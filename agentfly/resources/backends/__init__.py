"""Where resource instances run: ``local`` child processes (default), ``docker`` containers, and Ray actors
(``ray``), and the one shape a sandbox worker has on every backend (``SandboxWorker``)."""

from __future__ import annotations

from typing import Any, Protocol

from agentfly.resources.backends.local import Isolation, Limits, LocalWorker


class SandboxWorker(Protocol):
    """A worker process that runs a sandbox's requests, as ``PythonSandbox`` and ``ScienceWorld`` drive it:
    ``LocalWorker`` (a child process, under bubblewrap where it exists) and ``DockerWorker`` (a container)
    implement it; both speak the JSON-lines protocol of ``backends/_worker.py``."""

    report: dict[str, Any]  # the isolation the worker reported when it started

    @property
    def alive(self) -> bool: ...

    def ended(self) -> tuple[str | None, str]:
        """After it stopped answering, how it ended: the failure kind (``agentfly.failures.FAILURE_KINDS``) when
        something neither the worker nor the sandbox's code and limits did ended it (the host's OOM killer, an
        operator, a container engine that went away), else None (its own death: an observation the model
        reads); and what happened, in words ("" when nothing more is known than that it stopped)."""
        ...

    async def start(self) -> None: ...

    async def request(self, message: dict[str, Any], timeout: float | None = None) -> dict[str, Any]: ...

    def kill(self) -> None: ...

    async def close(self) -> None: ...

    def kill_strays(self) -> int:
        """Kill what the sandbox's code left running after a request; how many."""
        ...


__all__ = ["Isolation", "Limits", "LocalWorker", "SandboxWorker"]
