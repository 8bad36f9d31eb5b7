"""``PythonSandbox``: a persistent Python interpreter per rollout, in a process we can kill.

    box = PythonSandbox()               # or let a ResourceEngine pool them: factory=PythonSandbox
    await box.start()
    await box.run("x = 6 * 7")          # ''
    await box.run("x")                  # '42'  (state survives between calls, like a notebook)
    await box.run("while True: pass", timeout=1)   # 'Error: execution timed out after 1 s ... restarted ...'
    await box.close()

Results are text for the model: stdout, then stderr (with the traceback of an exception), each truncated
with a marker. A call that times out or kills the interpreter (CPU limit, a crash) restarts the process and
says so, since its variables are gone. ``reset()`` (between rollouts) clears variables, files, environment
variables and stray processes; when the interpreter has leftover threads or has used half its CPU budget it
is replaced instead, so no state leaks from one rollout to the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentfly.resources.backends import SandboxWorker
from agentfly.resources.backends.local import Isolation, Limits, LocalWorker
from agentfly.resources.spec import InfrastructureFailure, ResourceError

DEFAULT_MAX_OUTPUT = 10_000


@dataclass(frozen=True)
class Execution:
    """One call's outcome: the text for the model, the exception name if it raised, and whether the
    interpreter had to be restarted (timeout or crash), which loses its state."""

    text: str
    error: str | None = None
    restarted: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


class PythonSandbox:
    """A sandboxed interpreter. Options (also from ``ResourceSpec.options``):

    Args:
        spec: the ResourceSpec when built by a pool (its ``backend`` and ``options`` are used).
        backend: "local" (a child process, default) or "docker" (a container; needs a docker engine).
        limits: ``Limits`` (CPU seconds, memory, files, processes) for each interpreter.
        isolation: ``Isolation`` (network, filesystem, private uid) for the local backend.
        files: {relative path: text or bytes} written into the working directory at start and after each
            reset: the files the code is given.
        timeout: the default per-call timeout in seconds.
        max_output: characters of stdout and of stderr returned per call before the truncation marker.
        image: the docker image (docker backend only).
        engines: where containers run (docker backend only): a ``DockerEngines`` shared by the pool, or a list
            of ``DockerEngine`` / their dicts (each with its own ``max``). Without it, ``base_url`` and
            ``tls_ca_cert`` / ``tls_client_cert`` / ``tls_client_key`` in the options name one engine, else
            ``DOCKER_HOST`` does.
    """

    kind = "sandbox"

    def __init__(
        self,
        spec: Any = None,
        *,
        backend: str | None = None,
        limits: Limits | None = None,
        isolation: Isolation | None = None,
        files: dict[str, str | bytes] | None = None,
        timeout: float = 10.0,
        max_output: int = DEFAULT_MAX_OUTPUT,
        image: str | None = None,
        engines: Any = None,
    ) -> None:
        options = dict(getattr(spec, "options", None) or {})
        # The spec's own dict, not the copy: the docker engines' counts are shared by the whole pool.
        spec_options = getattr(spec, "options", None)
        self.docker_options: dict[str, Any] = (
            {"engines": engines} if engines is not None
            else spec_options if isinstance(spec_options, dict) else options
        )
        self.backend = backend or options.pop("backend", None) or getattr(spec, "backend", None) or "local"
        if self.backend not in ("local", "docker"):
            raise ValueError(
                f"PythonSandbox backend={self.backend!r}: code runs in a child process ('local') or a container "
                "('docker'), never in-process"
            )
        self.limits = limits or options.get("limits") or Limits()
        self.isolation_config = isolation or options.get("isolation") or Isolation()
        self.files = files if files is not None else options.get("files") or {}
        self.timeout = float(options.get("timeout", timeout))
        self.max_output = int(options.get("max_output", max_output))
        self.image = image or options.get("image")
        self.worker: SandboxWorker | None = None
        self.restarts = 0

    def _new_worker(self) -> SandboxWorker:
        if self.backend == "docker":
            from agentfly.resources.backends.docker import DockerWorker, engines_of

            return DockerWorker(limits=self.limits, image=self.image, engines=engines_of(self.docker_options))
        return LocalWorker(limits=self.limits, isolation=self.isolation_config)

    async def start(self) -> None:
        self.worker = self._new_worker()
        await self.worker.start()
        if self.files:
            await self._write_files()

    async def _write_files(self) -> None:
        assert self.worker is not None  # called by start, once the worker runs
        # Written from inside, so the files belong to the sandbox's uid and land in its working directory.
        for rel, content in self.files.items():
            if os.path.isabs(rel) or ".." in Path(rel).parts:
                raise ValueError(f"sandbox file {rel!r}: give a relative path inside the working directory")
            data = content.encode() if isinstance(content, str) else content
            code = (
                "import os as _os\n"
                f"_os.makedirs(_os.path.dirname({rel!r}) or '.', exist_ok=True)\n"
                f"open({rel!r}, 'wb').write({data!r})\n"
                "del _os"
            )
            reply = await self.worker.request({"op": "exec", "code": code, "max_output": 1000}, 30)
            if reply.get("error"):
                raise ResourceError(f"could not write sandbox file {rel!r}: {reply.get('stderr', '')[-300:]}")

    def isolation(self) -> dict[str, Any]:
        """What took effect in the first interpreter: limits, network, user, filesystem (for the stats)."""
        return dict(self.worker.report) if self.worker is not None else {}

    async def run(self, code: str, timeout: float | None = None) -> str:
        """Run ``code`` in this rollout's interpreter and return what it printed (or the error) as text."""
        result = await self.execute(code, timeout)
        return result.text

    async def execute(self, code: str, timeout: float | None = None) -> Execution:
        """Run ``code`` and return the structured result (``run`` is this, as text)."""
        timeout = self.timeout if timeout is None else float(timeout)
        if self.worker is None:
            raise ResourceError("PythonSandbox.run before start(); acquire it from a ResourceEngine or await start()")
        if not self.worker.alive:
            await self._restart()
        try:
            reply = await self.worker.request(
                {"op": "exec", "code": code, "max_output": self.max_output}, timeout
            )
        except TimeoutError:
            await self._restart()
            return Execution(
                text=f"Error: execution timed out after {timeout:g} s and was killed; the sandbox was restarted, "
                "so variables and files from earlier calls are gone.",
                error="Timeout", restarted=True,
            )
        except ResourceError as exc:  # the process died (a crash, a limit) or broke the protocol
            kind, how = await asyncio.to_thread(self.worker.ended)
            if kind is not None:
                # Ended by neither its own code, its limits nor its timeout: the host's OOM killer, an operator,
                # a node or a container engine going down. Not the agent's doing, so the rollout ends as an
                # infrastructure failure; the next call starts a new worker (or says why it cannot).
                with contextlib.suppress(Exception):
                    await self._restart()
                raise InfrastructureFailure(f"the sandbox was ended from outside: {how} ({exc})", kind) from exc
            await self._restart()
            return Execution(
                text=f"Error: {how or exc}; the sandbox was restarted, so variables and files from earlier calls are "
                     "gone.",
                error="Died", restarted=True,
            )
        if not reply.get("ok", False):
            return Execution(text=f"Error: {reply.get('error', 'the sandbox refused the request')}", error="Refused")
        return Execution(text=format_result(reply), error=reply.get("error"))

    async def _restart(self) -> None:
        self.restarts += 1
        if self.worker is not None:
            await self.worker.close()
        await self.start()

    async def reset(self) -> None:
        """Clean state for the next rollout; raises when the interpreter is not trustworthy any more."""
        if self.worker is None or not self.worker.alive:
            raise ResourceError("sandbox process is not running")
        if self.backend == "docker":
            # Containers are cheap to replace and the image is the clean state: a fresh one per rollout.
            await self._restart()
            return
        self.worker.kill_strays()
        reply = await self.worker.request({"op": "reset"}, 10)
        if not reply.get("ok"):
            raise ResourceError(f"sandbox reset failed: {reply.get('error')}")
        if reply.get("threads", 1) > 1:
            raise ResourceError(f"sandbox has {reply['threads'] - 1} leftover thread(s); replacing it")
        budget = self.limits.cpu_seconds
        if budget and reply.get("cpu_seconds", 0) > budget / 2:
            raise ResourceError("sandbox used over half its CPU-time budget; replacing it")
        if self.files:
            await self._write_files()

    async def health(self) -> bool:
        if self.worker is None or not self.worker.alive:
            return False
        reply = await self.worker.request({"op": "ping"}, 5)
        return bool(reply.get("ok"))

    async def close(self) -> None:
        if self.worker is not None:
            await self.worker.close()

    def kill(self) -> None:
        if self.worker is not None:
            self.worker.kill()

    @property
    def pid(self) -> int | None:
        """The interpreter's pid as the host sees it (below bubblewrap, when the local backend confines it)."""
        return getattr(self.worker, "worker_pid", None) or getattr(self.worker, "pid", None)

    @property
    def workdir(self) -> str | None:
        return getattr(self.worker, "workdir", None)

    async def __aenter__(self) -> PythonSandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def format_result(reply: dict[str, Any]) -> str:
    """stdout, then stderr, each with a truncation marker when it was cut."""
    parts = []
    out = reply.get("stdout", "")
    if reply.get("stdout_truncated"):
        out += f"\n... [output truncated: {reply['stdout_truncated']} more bytes]"
    if out:
        parts.append(out)
    err = reply.get("stderr", "")
    if reply.get("stderr_truncated"):
        err += f"\n... [stderr truncated: {reply['stderr_truncated']} more bytes]"
    if err:
        parts.append(err if not parts else "[stderr]\n" + err)
    return "\n".join(parts)


def docker_available() -> str | None:
    """None when a docker engine answers, else why not (for skip reasons and errors)."""
    try:
        import docker
    except ImportError:
        return "the docker SDK is not installed (pip install docker)"
    if shutil.which("docker") is None and not os.path.exists("/var/run/docker.sock"):
        return "no docker engine on this machine"
    try:
        docker.from_env(timeout=5).ping()
    except Exception as exc:
        return f"the docker engine does not answer: {type(exc).__name__}: {exc}"
    return None
