"""An MCP server as a pooled resource: one instance is one client session, held by a rollout across its turns.

    KV = mcp_server("kv", command=[sys.executable, "agentfly/resources/mcp_servers/kv_store.py"])   # stdio, rollout scope
    DOCS = mcp_server("docs", url="http://127.0.0.1:8765/mcp", scope="global")           # a stateless HTTP server
    tools = tools_from(KV)                    # Tools with the server's own names, descriptions and input schemas
    agent = af.Agent(model, tools=tools, resources=af.ResourceEngine([KV]))

What an instance is, by transport and scope:

- **stdio**: a server process started by the local backend (``LocalWorker``) under the sandbox's isolation: no
  secrets in its environment, rlimits, no network unless ``network="host"``, no capability, and a bubblewrap
  root holding only the Python installation, the system libraries, AgentFly's own servers and ``read_paths``
  (its argv never adds a path), writable only in its working directory; and the SDK's
  ``ClientSession`` over its pipes. ``reset`` between rollouts restarts the process, or, when the server offers
  one, calls its ``reset_tool``; a server that dies mid-rollout is an ``InfrastructureFailure`` and the pool
  starts a new one.
- **streamable HTTP**: a ``ClientSession`` over the SDK's ``streamable_http_client``; ``reset`` ends the session
  (the server forgets it) and opens a new one, so the next rollout starts clean.
- ``scope="rollout"`` (default): a rollout gets its own session on first use and keeps it across its turns.
  ``scope="global"``: one session shared by every rollout, for stateless servers.

The session is an async context manager; its lifetime is the instance's. A task of its own enters it in
``start`` and leaves it in ``close``, because anyio requires a context to be left by the task that entered it,
while calls arrive from the rollouts' tasks.

A call is checked against the server's input schema first (a bad call is an observation the model reads, as
is an error the tool reports); a server that dies, stops answering or times out raises ``InfrastructureFailure``
(``instance_crashed`` for a stdio process that died, ``server_down`` otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentfly import urls
from agentfly.resources.backends.local import WORKER, Isolation, Limits, LocalWorker
from agentfly.resources.spec import InfrastructureFailure, Pool, ResourceError, ResourceSpec

if TYPE_CHECKING:  # the SDK is imported where it is used, so that importing agentfly does not need it
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
    from mcp import ClientSession
    from mcp.shared.message import SessionMessage
    from mcp.types import CallToolResult, Tool

LAUNCHER = Path(__file__).resolve().with_name("_mcp_launch.py")
BUNDLED = Path(__file__).resolve().with_name("mcp_servers")  # AgentFly's own servers (kv_store.py)
MAX_OBSERVATION = 16_000  # characters of a tool result the model reads; the rest is cut with a note


class MCPToolError(Exception):
    """The server answered, and the tool reported an error (``isError``): the model reads it."""


class MCPArgumentError(ValueError):
    """Arguments that break the tool's input schema (the message names each problem): the model reads it.
    (Not the tool layer's ``ArgumentError``: the resource layer sits below the tools; ``agentfly.mcp`` converts.)"""


def mcp_server(
    name: str,
    *,
    command: Sequence[str] | None = None,
    url: str | None = None,
    address: str | None = None,
    scope: str = "rollout",
    pool: Pool | None = None,
    acquire_timeout: float | None = 60.0,
    call_timeout: float = 30.0,
    start_timeout: float = 60.0,
    reset_tool: str | None = None,
    seed_tool: str | None = None,
    network: str = "none",
    read_paths: Sequence[str] = (),
    env: dict[str, str] | None = None,
    limits: Limits | None = None,
    health_interval: float = 30.0,
) -> ResourceSpec:
    """A ``ResourceSpec`` whose instances are sessions of an MCP server.

    Args:
        name: the resource's name; tools from ``tools_from`` ask for it.
        command: a stdio server's argv, run in the sandbox. Its entries are strings only: a file it names is
            readable there only when it is in ``read_paths`` (or one of AgentFly's own servers).
        url: a streamable-HTTP server's endpoint, e.g. ``http://127.0.0.1:8765/mcp`` (parsed by
            ``agentfly.urls``: no userinfo, no dot segments).
        address: the IP address to connect to for ``url``'s host instead of looking it up, e.g. the one a
            check of the host's addresses approved (the web app's worker passes it); the URL, Host header and
            TLS name stay the host's.
        scope: "rollout" (a session per rollout, reset between rollouts) or "global" (one shared session).
        pool: ``Pool(min, max)`` sessions (stdio: processes); defaults to ``Pool(0, 8)``.
        acquire_timeout: seconds a rollout waits for a free session before ``ResourceTimeout``.
        call_timeout: seconds a tool call may take before the server counts as down.
        start_timeout: seconds to start the server and open the session.
        reset_tool: a tool of the server that forgets the session's state; reset calls it instead of
            restarting the process (stdio) or reopening the session (HTTP). Hidden from the model.
        seed_tool: a tool of the server that loads a rollout's task data into its session: called once, at the
            rollout's first call, with the sample's fields that the tool's input schema names (a key-chain store
            seeded with the sample's chain). Hidden from the model.
        network: "none" (the stdio server has no network) or "host".
        read_paths: the files and folders a stdio server may read besides the Python installation (its script,
            its data), read-only; each must be readable by other users (the server holds no capability).
        env: environment variables for a stdio server (nothing of the parent's environment is passed).
        limits: rlimits of a stdio server (default: the sandbox's, with 2 GiB of address space).
        health_interval: seconds between health probes (an MCP ping) of idle sessions; 0 turns them off.
    """
    if (command is None) == (url is None):
        raise ValueError(f"mcp_server {name!r}: give exactly one of command=[...] (stdio) or url=... (HTTP)")
    if command is not None and (isinstance(command, str) or not command):
        raise ValueError(f"mcp_server {name!r}: command is an argv list, e.g. [sys.executable, 'server.py']")
    if url is not None:
        try:
            urls.parse(url, what=f"mcp_server {name!r}: url")
        except urls.URLRefused as exc:
            raise ValueError(str(exc)) from None
    if address is not None and (url is None or urls.ip_literal(address) is None):
        raise ValueError(f"mcp_server {name!r}: address={address!r} must be an IP address, given with url=...")
    if network not in ("none", "host"):
        raise ValueError(f"mcp_server {name!r}: network={network!r}; use 'none' or 'host'")
    if call_timeout <= 0 or start_timeout <= 0:
        raise ValueError(f"mcp_server {name!r}: call_timeout and start_timeout must be positive seconds")
    options: dict[str, Any] = {
        # Files named relative to here: the server runs in its own working directory.
        "command": [os.path.realpath(a) if i and os.path.isfile(a) else a for i, a in enumerate(command)]
        if command is not None else None,
        "url": url,
        "address": address,
        "call_timeout": float(call_timeout),
        "start_timeout": float(start_timeout),
        "reset_tool": reset_tool,
        "seed_tool": seed_tool,
        "network": network,
        "read_paths": list(read_paths),
        "env": dict(env or {}),
        "limits": limits or Limits(memory_bytes=2 << 30),
    }
    return ResourceSpec(name=name, factory=MCPSession, kind="mcp", backend="local" if command else "inprocess",
                        pool=pool or Pool(0, 8), scope=scope, acquire_timeout=acquire_timeout,
                        health_interval=health_interval, options=options)


@asynccontextmanager
async def _pipe_streams(proc: asyncio.subprocess.Process) -> AsyncIterator[
        tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]]:
    """MCP's stdio framing (one JSON-RPC message per line) over a process the sandbox backend started.

    The SDK's ``stdio_client`` starts its own process; here the process is the local backend's, so that it
    runs under the sandbox's isolation, and only the framing is done here, with the SDK's message types.
    """
    import anyio
    import mcp.types as types
    from mcp.shared.message import SessionMessage

    assert proc.stdout is not None and proc.stdin is not None
    stdout, stdin = proc.stdout, proc.stdin
    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](0)

    async def reader() -> None:
        async with read_send:
            while line := await stdout.readline():
                message: SessionMessage | Exception
                try:
                    message = SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
                except ValueError as exc:
                    message = exc
                await read_send.send(message)

    async def writer() -> None:
        async with write_recv:
            async for message in write_recv:
                data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    stdin.write(data.encode() + b"\n")
                    await stdin.drain()

    async with anyio.create_task_group() as group:
        group.start_soon(reader)
        group.start_soon(writer)
        try:
            yield read_recv, write_send
        finally:
            group.cancel_scope.cancel()


def _http_reason(exc: BaseException, redirected: int | None = None) -> str:
    """Why an HTTP server did not open a session, in words that quote nothing it sent: a URL may reach a
    service that is no MCP server (an internal one, by mistake or on purpose), and its answer would otherwise
    come back in the error. A connection failure, an HTTP status and a redirect (``redirected``: its status;
    never followed) are shown; any other answer is not."""
    import httpx2

    if redirected is not None:
        return (f"it answered HTTP {redirected}, a redirect, which is not followed: only the URL that was checked "
                "is spoken to; give the server's own MCP endpoint")
    if isinstance(exc, httpx2.HTTPStatusError):
        return f"it answered HTTP {exc.response.status_code}"
    if isinstance(exc, httpx2.TransportError | OSError | TimeoutError):
        return f"{type(exc).__name__}: {exc}"
    return (f"{type(exc).__name__}: what it answered is not an MCP session (not shown here: check that the URL "
            "is the server's MCP endpoint)")


def _http_client(url: str, address: str | None, redirects: list[int] | None = None) -> Any:
    """The SDK's HTTP client with its timeouts, taking no proxy from the environment (a proxy would look the
    host up again) and, given ``address``, connecting to that address for the URL's host. The status of each
    redirect it is answered (and does not follow) goes into ``redirects``, for the error."""
    import httpcore2
    import httpx2
    from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT

    timeout = httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT)
    transport = httpx2.AsyncHTTPTransport(trust_env=False)
    if address is not None:
        # httpx2 builds its pool without a way to choose the network backend: build the same pool with one.
        transport._pool = httpcore2.AsyncConnectionPool(
            ssl_context=httpx2.create_ssl_context(trust_env=False),
            network_backend=urls.pinned_backend(urls.parse(url).host, address))
    async def note_redirect(response: Any) -> None:
        if response.is_redirect and redirects is not None:
            redirects.append(response.status_code)

    return httpx2.AsyncClient(transport=transport, timeout=timeout, trust_env=False,
                              event_hooks={"response": [note_redirect]})


class MCPSession:
    """One client session of an MCP server (see the module docstring). ``call`` is what tools use."""

    kind = "mcp"

    def __init__(self, spec: ResourceSpec) -> None:
        self.name = spec.name
        options = spec.options
        self.command: list[str] | None = options.get("command")
        self.url: str | None = options.get("url")
        self.address: str | None = options.get("address")
        self._redirects: list[int] = []  # statuses of the redirects an HTTP server answered (never followed)
        self.call_timeout = float(options.get("call_timeout", 30.0))
        self.start_timeout = float(options.get("start_timeout", 60.0))
        self.reset_tool: str | None = options.get("reset_tool")
        self.network = str(options.get("network", "none"))
        # Only what the caller named: an argv entry is a string for the server, never a mount (an argv naming
        # /etc/shadow or another team's plugin gets the server nothing it could not read before).
        self.read_paths = list(options.get("read_paths", []))
        self.env: dict[str, str] = dict(options.get("env") or {})
        self.limits: Limits = options.get("limits") or Limits(memory_bytes=2 << 30)
        self.session: ClientSession | None = None
        self.worker: LocalWorker | None = None
        self.tools: list[Tool] = []  # the server's tool listing, as it gave it
        self.calls = 0
        self.failures = 0
        self.restarts = 0
        self.closed = False
        self._task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._lost: str | None = None  # why the session is unusable (a crash, a timeout)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self.closed:
            raise ResourceError(f"MCP session {self.name!r} was closed")
        self._lost = None
        self._stop = asyncio.Event()
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._serve(ready, self._stop), name=f"mcp-{self.name}")
        try:
            await asyncio.wait_for(asyncio.shield(ready), self.start_timeout)
        except BaseException as exc:
            # What the server printed before it went (e.g. a script it could not open), while its pipe is open.
            printed = await self.worker.printed() if self.worker is not None else ""
            code = self.worker.exit_code() if self.worker is not None else None
            await self._shutdown()
            if isinstance(exc, InfrastructureFailure | asyncio.CancelledError):
                raise
            where = " ".join(self.command) if self.command else self.url
            while isinstance(exc, BaseExceptionGroup) and exc.exceptions:  # anyio's task groups wrap the cause
                exc = exc.exceptions[0]
            said = f"; it printed: {printed[-1000:]}" if printed else ""
            if code is not None:  # gone before it answered: how it ended (a signal is negative)
                said += f"; it had exited with {code}"
            reason = f"{type(exc).__name__}: {exc}" if self.command else _http_reason(
                exc, self._redirects[0] if self._redirects else None)
            raise InfrastructureFailure(f"MCP server {self.name!r} ({where}) did not start: {reason}{said}",
                                        "server_down") from exc

    async def _serve(self, ready: asyncio.Future[None], stop: asyncio.Event) -> None:
        """Own the transport and the session from entry to exit (anyio wants one task to do both)."""
        from mcp import ClientSession

        try:
            async with contextlib.AsyncExitStack() as stack:
                if self.url is not None:
                    from mcp.client.streamable_http import streamable_http_client

                    client = await stack.enter_async_context(_http_client(self.url, self.address, self._redirects))
                    read, write = (await stack.enter_async_context(
                        streamable_http_client(self.url, http_client=client)))[:2]
                else:
                    assert self.command is not None
                    worker = LocalWorker(
                        [sys.executable, "-I", str(LAUNCHER), "--", *self.command],
                        limits=self.limits,
                        # The launcher, the sandbox worker it hardens itself with and AgentFly's own servers,
                        # read-only, besides the paths the caller gave.
                        isolation=Isolation(network=self.network,
                                            read_paths=(str(LAUNCHER), str(WORKER), str(BUNDLED),
                                                        *self.read_paths)),
                        env=self.env, ready_timeout=self.start_timeout,
                    )
                    self.worker = worker
                    stack.push_async_callback(worker.close)
                    await worker.start()
                    assert worker.proc is not None
                    read, write = await stack.enter_async_context(_pipe_streams(worker.proc))
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                listing = await session.list_tools()
                self.tools = list(listing.tools)
                self.session = session
                ready.set_result(None)
                await stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            elif not isinstance(exc, asyncio.CancelledError):
                self._lost = f"{type(exc).__name__}: {exc}" if self.command else _http_reason(exc)
        finally:
            self.session = None

    async def _shutdown(self) -> None:
        if self._stop is not None:
            self._stop.set()
        task, self._task = self._task, None
        if task is not None:
            try:
                await asyncio.wait_for(task, 10)
            except (TimeoutError, asyncio.CancelledError, Exception):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if self.worker is not None:
            await self.worker.kill_async()  # whatever close() left (a server that ignores stdin closing)
            self.worker = None
        self.session = None

    async def restart(self) -> None:
        await self._shutdown()
        self.restarts += 1
        await self.start()

    async def reset(self) -> None:
        """A clean session for the next rollout: the server's reset tool, else a new process or session."""
        if self._lost is None and self.session is not None and self.reset_tool is not None:
            result = await self._call(self.reset_tool, {})
            if not getattr(result, "is_error", False):
                return
        await self.restart()

    async def health(self) -> bool:
        if self.closed or self.session is None or self._lost is not None:
            return False
        if self.worker is not None and not self.worker.alive:
            return False
        try:
            await asyncio.wait_for(self.session.send_ping(), min(self.call_timeout, 10.0))
        except Exception:
            return False
        return True

    async def close(self) -> None:
        self.closed = True
        await self._shutdown()

    def kill(self) -> None:
        self.closed = True
        if self.worker is not None:
            self.worker.kill()
        if self._task is not None:
            self._task.cancel()

    def isolation(self) -> dict[str, object]:
        """Shown in the pool stats: the transport, what the sandbox reported, and the call counts."""
        info: dict[str, object] = {"transport": "http" if self.url else "stdio", "calls": self.calls,
                                "failures": self.failures, "restarts": self.restarts}
        if self.worker is not None:
            info.update(self.worker.report)
        return info

    # ------------------------------------------------------------------ calls
    def tool_schema(self, tool: str) -> dict[str, Any] | None:
        for entry in self.tools:
            if entry.name == tool:
                return entry.input_schema
        return None

    def _failure(self, reason: str) -> InfrastructureFailure:
        self.failures += 1
        self._lost = reason
        crashed = self.worker is not None and not self.worker.alive
        where = "process" if self.command else f"server at {self.url}"
        return InfrastructureFailure(f"MCP {where} {self.name!r}: {reason}",
                                     "instance_crashed" if crashed else "server_down")

    async def _call(self, tool: str, arguments: dict[str, Any]) -> CallToolResult:
        from mcp import MCPError
        from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        if self._lost is not None or self.session is None:
            raise self._failure(self._lost or "the session is closed")
        try:
            return await asyncio.wait_for(self.session.call_tool(tool, arguments), self.call_timeout)
        except TimeoutError:
            raise self._failure(f"no answer to {tool!r} within {self.call_timeout:g} s") from None
        except MCPError as exc:
            if exc.error.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT) or (self.worker and not self.worker.alive):
                raise self._failure(f"{tool!r}: {exc}") from None
            raise MCPToolError(str(exc)) from None  # a JSON-RPC error the live server answered with
        except (OSError, EOFError, ConnectionError) as exc:
            raise self._failure(f"{tool!r}: {type(exc).__name__}: {exc}") from None
        except Exception as exc:
            if self.worker is not None and not self.worker.alive:
                raise self._failure(f"{tool!r}: {type(exc).__name__}: {exc}") from None
            if type(exc).__module__.startswith(("httpx", "httpcore", "anyio")):
                raise self._failure(f"{tool!r}: {type(exc).__name__}: {exc}") from None
            raise

    async def seed_once(self, info: dict[str, Any], sample: Mapping[str, Any], tool: str,
                        fields: Sequence[str]) -> None:
        """Load a rollout's task data into this session: call ``tool`` with the ``fields`` of ``sample`` it has,
        the first time the rollout (whose ``info`` dict records it) asks, and never again for that rollout."""
        flag = f"mcp_seeded:{self.name}"
        if not info.get(flag):
            await self.call(tool, {k: sample[k] for k in fields if k in (sample or {})})
            info[flag] = True

    async def call(self, tool: str, arguments: dict[str, Any] | None = None) -> str:
        """Call ``tool`` and return its text for the model; ``MCPToolError`` when the tool reports an error.

        The arguments are checked against the server's input schema first (each
        problem, ``MCPArgumentError``); a failure of the server raises ``InfrastructureFailure``.
        """
        arguments = dict(arguments or {})
        schema = self.tool_schema(tool)
        if schema is None and self.session is not None:
            names = ", ".join(t.name for t in self.tools)
            raise MCPToolError(f"the MCP server {self.name!r} has no tool {tool!r}; it has: {names}")
        check_arguments(tool, schema or {}, arguments)
        self.calls += 1
        result = await self._call(tool, arguments)
        text = result_text(result)
        if getattr(result, "is_error", False):
            raise MCPToolError(text)
        return text


def check_arguments(tool: str, schema: Mapping[str, object], arguments: Any) -> None:
    """Raise ``MCPArgumentError`` naming every way ``arguments`` break the tool's JSON schema."""
    import jsonschema

    if not isinstance(arguments, dict):
        raise MCPArgumentError(f"arguments for tool '{tool}' must be a JSON object, got {type(arguments).__name__}")
    validator = jsonschema.Draft202012Validator(schema)
    problems = []
    for error in sorted(validator.iter_errors(arguments), key=lambda e: list(e.path)):
        where = ".".join(str(p) for p in error.path) or "(arguments)"
        problems.append(f"{where}: {error.message}")
    if problems:
        raise MCPArgumentError(f"invalid arguments for tool '{tool}': " + "; ".join(problems))


def result_text(result: CallToolResult) -> str:
    """The text of a ``CallToolResult``: its text blocks, else its structured content as JSON, bounded."""
    parts = [block.text for block in getattr(result, "content", []) if getattr(block, "type", "") == "text"]
    if not parts and getattr(result, "structured_content", None) is not None:
        parts = [json.dumps(result.structured_content, ensure_ascii=False)]
    text = "\n".join(parts)
    if len(text) > MAX_OBSERVATION:
        text = text[:MAX_OBSERVATION] + f"\n[... {len(text) - MAX_OBSERVATION} more characters cut]"
    return text
