"""An environment whose simulator runs in a child process of its own (a ``LocalWorker`` serving the worker
protocol): starting it, asking it, and the lifecycle a pool needs (health, close, kill, the pid and the
isolation report). ScienceWorld (a JVM) and TextWorld (a z-machine) are such environments; each supplies its
worker module, its environment variables and its availability check.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from agentfly.resources.backends.local import LocalWorker
from agentfly.resources.spec import ResourceError


class WorkerEnvironment:
    """The child-process side of a simulated environment; subclasses name it (``title``) and start it."""

    kind = "environment"
    title = "the environment"

    def __init__(self) -> None:
        self.worker: LocalWorker | None = None

    async def start_worker(self, module: str, env: dict[str, str], unavailable: str | None) -> None:
        """Start ``python -m module`` as this instance's worker (trusted code: the simulator, not the agent's,
        so not hardened), or raise ResourceError with ``unavailable`` (why it cannot run here)."""
        if unavailable:
            raise ResourceError(f"{self.title} cannot start: {unavailable}")
        root = str(Path(__file__).resolve().parents[2])  # the folder that holds the agentfly package
        self.worker = LocalWorker([sys.executable, "-m", module], env={"PYTHONPATH": root, **env}, harden=False,
                                  ready_timeout=120)
        await self.worker.start()

    async def _ask(self, message: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
        if self.worker is None:
            raise ResourceError(f"{self.title} used before start(); acquire it from a ResourceEngine")
        reply = await self.worker.request(message, timeout)
        if not reply.get("ok"):
            raise ResourceError(f"{self.title}: {reply.get('error')}")
        return reply

    async def health(self) -> bool:
        if self.worker is None or not self.worker.alive:
            return False
        return bool((await self._ask({"op": "ping"}, timeout=10)).get("ok"))

    async def close(self) -> None:
        if self.worker is not None:
            await self.worker.close()

    def kill(self) -> None:
        if self.worker is not None:
            self.worker.kill()

    def isolation(self) -> dict[str, Any]:
        return dict(self.worker.report) if self.worker is not None else {}

    @property
    def pid(self) -> int | None:
        return self.worker.pid if self.worker is not None else None
