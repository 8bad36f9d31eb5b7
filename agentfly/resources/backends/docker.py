"""The ``docker`` backend: a sandbox is a container, driven over the same JSON-lines worker protocol.

Each container runs ``python -c <_worker.py>`` from a stock Python image (nothing to build), as user
nobody, with ``network_mode="none"``, a read-only root filesystem, a small tmpfs as its working directory,
memory, CPU and process limits, and it is removed when the sandbox closes (and, for sandboxes, on every
release: a fresh container per rollout). The protocol runs over the container's attached stdin/stdout.

The SDK's calls block, so they run in worker threads; a reply that does not come in time gets the
container killed, which also unblocks the reading thread.

Sandboxes need not run where the trainer runs. A pool names the engine (``DockerEngine(base_url=
"tcp://sandbox-host-3:2376", tls_ca_cert=..., tls_client_cert=..., tls_client_key=...)``; by default
``DOCKER_HOST``, else the local socket), or spreads over several with a limit each (``DockerEngines``):

    ENGINES = DockerEngines([DockerEngine("tcp://sandbox-a:2376", max=16, **tls), DockerEngine(max=4)])
    PY = ResourceSpec(name="python", factory=PythonSandbox, backend="docker", pool=Pool(0, 20),
                      options={"engines": ENGINES})
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import logging
import os
import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from time import time_ns
from typing import Any, TypeVar

from agentfly.resources.backends.local import WORKER, Limits, process_alive, start_time
from agentfly.resources.spec import ResourceError

T = TypeVar("T")
log = logging.getLogger(__name__)

DEFAULT_IMAGE = os.environ.get("AGENTFLY_SANDBOX_IMAGE", "python:3.11-slim")
# The docker SDK's calls block, and a workspace's command holds its thread for as long as it runs: they get
# threads of their own, enough for every command of a large pool at once (the event loop's default executor
# has the cores + 4, and would queue a group's commands behind each other).
# A client keeps as many connections per pool (the SDK's pools are per URL: all container creations share
# one), so that a connection coming back never finds its pool full. The SDK's "pool is full" path read the
# pool after another thread's call had closed it (its cache of 25 pools drops and closes the oldest), and 64
# workspaces forked at once failed in urllib3: 'NoneType' object has no attribute 'qsize'.
THREADS = 128
_THREADS = concurrent.futures.ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="agentfly-docker")


async def blocking(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on one of the docker calls' threads."""
    return await asyncio.get_running_loop().run_in_executor(_THREADS, functools.partial(fn, *args))


# ------------------------------------------------------------------ what a process leaves on an engine
# Every container (and fork image) this backend makes is labelled with the process that made it. A trainer
# that was SIGKILLed never closed its pools, so its containers would run on; the first use of an engine by a
# later process on the same host removes those whose owner is gone (``sweep_engine``).
SANDBOX_LABEL = "agentfly.sandbox"
OWNER_LABEL = "agentfly.owner"
_swept: set[str] = set()  # the engines this process has swept
_swept_lock = threading.Lock()


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _host() -> str:
    return _read("/etc/machine-id") or os.uname().nodename


@functools.cache
def owner() -> str:
    """This process, as the owner label of what it makes: ``host:boot:pid:start`` (host: the machine id, so
    a sweep on another host sharing the engine leaves it alone; boot and start time: so a pid reused since is
    not taken for the owner)."""
    return f"{_host()}:{_read('/proc/sys/kernel/random/boot_id')}:{os.getpid()}:{start_time(os.getpid()) or 0}"


def owner_gone(label: str) -> bool:
    """Whether the process an owner label names is known to be gone: on this host, and either made before
    its last boot or no longer running. Another host's label is never judged here."""
    host, boot, pid, started = [*label.split(":"), "", "", "", ""][:4]
    if host != _host() or not (pid.isdigit() and started.isdigit()):
        return False
    if boot != _read("/proc/sys/kernel/random/boot_id"):
        return True
    return not process_alive(int(pid), int(started))


def labels() -> dict[str, str]:
    return {SANDBOX_LABEL: "1", OWNER_LABEL: owner()}


def sweep_engine(client: Any) -> list[str]:
    """Remove the containers, then the fork images, on ``client``'s engine whose owner is gone
    (``owner_gone``); return their names and ids. One listing each when nothing is left over."""
    removed = []
    for container in client.containers.list(all=True, filters={"label": f"{SANDBOX_LABEL}=1"}):
        if owner_gone(container.labels.get(OWNER_LABEL, "")):
            with contextlib.suppress(Exception):
                container.remove(force=True)
                removed.append(container.name)
    for image in client.images.list(filters={"label": f"{SANDBOX_LABEL}=1"}):
        if owner_gone((image.labels or {}).get(OWNER_LABEL, "")):
            with contextlib.suppress(Exception):  # still the image of a live container: its owner's sweep
                client.images.remove(image.id)
                removed.append(image.id)
    if removed:
        log.warning("removed %d containers and images left on the docker engine by processes that are gone: %s",
                    len(removed), ", ".join(removed[:10]))
    return removed


@dataclass(frozen=True)
class DockerEngine:
    """One docker engine sandboxes may run on.

    Attributes:
        base_url: ``tcp://host:2376``, ``ssh://user@host`` or ``unix:///var/run/docker.sock``; None takes
            ``DOCKER_HOST`` (and ``DOCKER_TLS_VERIFY`` / ``DOCKER_CERT_PATH``) as the docker CLI does, else the
            local socket.
        tls_ca_cert: the CA that signed the engine's certificate (PEM path); with it the engine is verified.
        tls_client_cert, tls_client_key: this client's certificate and key (PEM paths), for an engine started
            with ``--tlsverify`` (it accepts only clients its CA signed).
        max: at most this many sandboxes at once on this engine (None: only the pool's ``max`` bounds it).
        timeout: seconds for one API call to the engine.
    """

    base_url: str | None = None
    tls_ca_cert: str | None = None
    tls_client_cert: str | None = None
    tls_client_key: str | None = None
    max: int | None = None
    timeout: float = 60.0

    def __post_init__(self) -> None:
        if (self.tls_client_cert is None) != (self.tls_client_key is None):
            raise ValueError(f"DockerEngine({self.name}): give tls_client_cert and tls_client_key together")
        if self.max is not None and self.max < 1:
            raise ValueError(f"DockerEngine({self.name}): max={self.max}; give at least 1, or None for no limit")
        for path in (self.tls_ca_cert, self.tls_client_cert, self.tls_client_key):
            if path is not None and not os.path.isfile(path):
                raise ValueError(f"DockerEngine({self.name}): TLS file {path!r} does not exist")

    @property
    def name(self) -> str:
        return self.base_url or os.environ.get("DOCKER_HOST") or "local socket"

    def client(self) -> Any:
        import docker

        if self.base_url is None and self.tls_ca_cert is None and self.tls_client_cert is None:
            return docker.from_env(timeout=int(self.timeout), max_pool_size=THREADS)
        tls: Any = False
        if self.tls_ca_cert or self.tls_client_cert:
            cert = (self.tls_client_cert, self.tls_client_key) if self.tls_client_cert else None
            tls = docker.tls.TLSConfig(client_cert=cert, ca_cert=self.tls_ca_cert, verify=self.tls_ca_cert or False)
        base_url = self.base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        # requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override a session's own CA, and hosts that set them
        # for their egress would then refuse the engine's certificate: the session must trust this CA alone,
        # from its first request on. So the client is made without asking the engine's API version (its first
        # request), and asks once trust_env is off.
        client = docker.DockerClient(base_url=base_url, tls=tls, timeout=int(self.timeout),
                                     version=docker.constants.MINIMUM_DOCKER_API_VERSION, max_pool_size=THREADS)
        client.api.trust_env = False
        client.api._version = client.api._retrieve_server_version()
        return client

    def connect(self) -> Any:
        """``client()``, after sweeping the engine of what dead processes of this host left, once a process."""
        client = self.client()
        with _swept_lock:
            first = self.name not in _swept
            _swept.add(self.name)
        if first:
            try:
                sweep_engine(client)
            except Exception as exc:  # a sweep that fails must not stop the sandbox that asked
                log.warning("could not sweep the docker engine %s: %s", self.name, exc)
        return client


class DockerEngines:
    """The engines one pool spreads its sandboxes over: each new container goes to the engine with the most
    room left (never past its ``max``), and its place is given back when the container is removed.

    One object is shared by every sandbox of a pool (pass it in ``ResourceSpec.options["engines"]``); it is
    thread-safe, since containers are created and removed in worker threads.
    """

    def __init__(self, engines: Iterable[DockerEngine | dict[str, Any] | str] | None = None) -> None:
        self.engines: list[DockerEngine] = [
            e if isinstance(e, DockerEngine) else DockerEngine(**e) if isinstance(e, dict) else DockerEngine(e)
            for e in (engines if engines is not None else [DockerEngine()])
        ]
        if not self.engines:
            raise ValueError("DockerEngines([]): name at least one engine (DockerEngine() is DOCKER_HOST)")
        self.in_use = [0] * len(self.engines)
        self._clients: dict[int, Any] = {}
        self._lock = threading.Lock()

    def place(self, on: int | None = None) -> tuple[int, Any]:
        """Reserve room on the engine with the most left (or on engine ``on``: where a fork's image is); returns
        (index, client). Raises when all are full."""
        with self._lock:
            def room(i: int) -> float:
                limit = self.engines[i].max
                return float("inf") if limit is None else limit - self.in_use[i]

            candidates = range(len(self.engines)) if on is None else [on]
            best = max(candidates, key=lambda i: (room(i), -self.in_use[i]))
            if room(best) <= 0:
                usage = ", ".join(f"{e.name} {n}/{e.max}" for e, n in zip(self.engines, self.in_use, strict=True))
                raise ResourceError(
                    f"every docker engine of this pool is at its limit ({usage}); lower the pool's max to the sum "
                    "of the engines' max, or add an engine"
                )
            self.in_use[best] += 1
            if best not in self._clients:
                try:
                    self._clients[best] = self.engines[best].connect()
                except Exception:
                    self.in_use[best] -= 1
                    raise
            return best, self._clients[best]

    def release(self, index: int) -> None:
        with self._lock:
            self.in_use[index] = max(0, self.in_use[index] - 1)

    def stats(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"engine": e.name, "in_use": n, "max": e.max}
                    for e, n in zip(self.engines, self.in_use, strict=True)]


def engines_of(options: dict[str, Any]) -> DockerEngines:
    """The pool's ``DockerEngines`` from its options: ``engines`` (a ``DockerEngines``, or a list of engines or
    their dicts), else one engine from ``base_url`` / ``tls_*``, else ``DOCKER_HOST``.

    A list is turned into one ``DockerEngines`` and stored back into ``options``, so that every sandbox of the
    pool (each built from the same spec) counts against the same per-engine limits.
    """
    engines = options.get("engines")
    if isinstance(engines, DockerEngines):
        return engines
    if engines is None:
        single = {k: options[k] for k in ("base_url", "tls_ca_cert", "tls_client_cert", "tls_client_key")
                  if options.get(k) is not None}
        engines = [DockerEngine(**single)]
    placed = DockerEngines(engines)
    options["engines"] = placed
    return placed


def container_end(container: Any, engine_name: str | None) -> tuple[str | None, str]:
    """How a container that stopped answering ended, as the engine records it (``State``):

    - ended by a signal the engine sent (its ``kill`` event: ``docker kill``/``stop``/``rm -f`` by someone
      else, the engine shutting down): ``killed``. The code in the sandbox cannot do this to itself: the
      container's PID 1 ignores every signal sent from inside its PID namespace, and an ``os._exit(137)``,
      which the engine records as the same status, comes with no ``kill`` event.
    - removed while it ran (the engine no longer knows it): ``killed``.
    - the engine does not answer: ``server_down`` (the host or its daemon went away).
    - OOM-killed by its own memory limit, or exited by itself (``os._exit``, a crash): None, the sandbox's
      own doing, an observation the model reads.
    """
    import docker
    import requests

    engine = engine_name or "the local engine"
    try:
        with contextlib.suppress(requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            container.wait(timeout=5)  # the stream closes a moment before the engine records the exit
        container.reload()
    except docker.errors.NotFound:
        return "killed", f"its container was removed from outside while it ran (on {engine})"
    except (docker.errors.APIError, requests.exceptions.RequestException, OSError) as exc:
        return "server_down", f"the docker engine {engine} stopped answering ({type(exc).__name__})"
    state = container.attrs.get("State", {})
    if state.get("Running"):
        return None, ""  # it broke the protocol and runs on
    if state.get("OOMKilled"):
        limit = container.attrs.get("HostConfig", {}).get("Memory") or 0
        return None, (f"its processes together used more than the container's memory ({limit >> 20} MiB) "
                      "and the kernel killed it")
    code = state.get("ExitCode")
    if code in (137, 143) and _engine_killed(container, state):
        by = "SIGKILLed" if code == 137 else "SIGTERMed"
        return "killed", f"its container was {by} from outside (on {engine})"
    return None, f"it exited with status {code}"


def _engine_killed(container: Any, state: dict[str, Any]) -> bool:
    """Whether the engine sent the container a signal (a ``kill`` event) between its creation and its end,
    both read on the engine's own clock, so a client whose clock is off asks for the right window."""
    import datetime

    import docker
    import requests

    def seconds(stamp: str) -> int:
        moment = datetime.datetime.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.UTC)
        return int(moment.timestamp())

    try:
        since, until = seconds(container.attrs["Created"]), seconds(state["FinishedAt"]) + 2
        events = container.client.events(since=since, until=until, decode=True,
                                         filters={"container": container.id, "event": "kill"})
        return any(True for _ in events)
    except (KeyError, ValueError, docker.errors.APIError, requests.exceptions.RequestException):
        return True  # an engine that gives no times or no events: trust the status


def require_image(client: Any, image: str, engine_name: str) -> None:
    """Raise ``ResourceError`` naming the fix when ``image`` is not on the engine (sandboxes pull nothing)."""
    import docker

    try:
        client.images.get(image)
    except docker.errors.ImageNotFound as exc:
        raise ResourceError(
            f"docker image {image!r} is not present on {engine_name}; run `docker pull {image}` there first (the "
            "sandbox has no network to pull it at run time)"
        ) from exc


class DockerWorker:
    """One container speaking the worker protocol; the same interface as ``LocalWorker``."""

    def __init__(self, limits: Limits | None = None, image: str | None = None, cpus: float = 1.0,
                 tmpfs_size: str = "64m", ready_timeout: float = 120.0,
                 engines: DockerEngines | None = None) -> None:
        self.limits = limits or Limits()
        self.engines = engines or DockerEngines()
        self.engine_index: int | None = None  # where this container runs, while it holds a place there
        self.image = image or DEFAULT_IMAGE
        self.cpus = cpus
        self.tmpfs_size = tmpfs_size
        self.ready_timeout = ready_timeout
        self.container: Any = None
        self.socket: Any = None
        self.raw: Any = None
        self.report: dict[str, Any] = {}
        self.pid: int | None = None
        self.uid: int | None = None
        self.workdir = "/work"
        self.proc = None
        self.lock = asyncio.Lock()
        self._buffer = b""
        self._dead = False
        self._read_lock = threading.Lock()
        self._kill_lock = threading.Lock()

    @property
    def alive(self) -> bool:
        return self.container is not None and not self._dead

    def ended(self) -> tuple[str | None, str]:
        """How the container that stopped answering ended (``container_end``); None when we removed it."""
        if self.container is None:  # we removed it ourselves: a timeout, a reset, close
            return None, ""
        return container_end(self.container, self.engine_name)

    def _create(self) -> None:
        with self._kill_lock:
            self.engine_index, client = self.engines.place()
        config = {
            "workdir": self.workdir,
            # The container does the isolating; inside, only the per-process limits the worker can set.
            # (The address-space limit too, so a big allocation is a MemoryError the model can read rather
            # than an out-of-memory kill of the whole container.)
            "limits": {k: v for k, v in {"cpu_seconds": self.limits.cpu_seconds,
                                          "memory_bytes": self.limits.memory_bytes,
                                          "open_files": self.limits.open_files,
                                          "file_size_bytes": self.limits.file_size_bytes}.items() if v},
            "network": "host", "filesystem": "host", "own_uid": False,
        }
        require_image(client, self.image, self.engines.engines[self.engine_index or 0].name)
        self.container = client.containers.create(
            self.image,
            command=["python", "-I", "-c", WORKER.read_text()],
            environment={"AGENTFLY_SANDBOX": json.dumps(config), "HOME": self.workdir, "TMPDIR": self.workdir},
            stdin_open=True,
            tty=False,
            user="65534:65534",
            # No working_dir: with one, docker (20.10) mounts the tmpfs without its mode, root-owned 0755, and
            # nobody cannot write its own working directory. The worker changes into it itself.
            network_mode="none",
            read_only=True,
            tmpfs={self.workdir: f"size={self.tmpfs_size},mode=1777"},
            # Headroom over the rlimit for the interpreter itself and the processes it may start.
            mem_limit=None if self.limits.memory_bytes is None else self.limits.memory_bytes * 2,
            memswap_limit=None if self.limits.memory_bytes is None else self.limits.memory_bytes * 2,
            nano_cpus=int(self.cpus * 1e9),
            pids_limit=self.limits.processes,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            labels=labels(),
        )
        # Attach before starting so the worker's first line (its ready message) cannot be missed.
        self.socket = self.container.attach_socket(params={"stdin": 1, "stdout": 1, "stream": 1})
        # Over a unix socket or plain TCP the SDK wraps the socket (SocketIO, the real one in ``_sock``); over
        # TLS it hands back the SSLSocket itself.
        self.raw = getattr(self.socket, "_sock", self.socket)
        self.container.start()

    def _recv_exact(self, n: int) -> bytes:
        raw = self.raw
        data = b""
        while len(data) < n:
            chunk = raw.recv(n - len(data))
            if not chunk:
                self._dead = True
                raise ResourceError("the sandbox container stopped")
            data += chunk
        return data

    def _read_line(self) -> dict[str, Any]:
        # Without a TTY docker multiplexes the streams: 8-byte header (stream, 0, 0, 0, big-endian size).
        with self._read_lock:
            while b"\n" not in self._buffer:
                stream, size = struct.unpack(">BxxxL", self._recv_exact(8))
                payload = self._recv_exact(size)
                if stream == 1:
                    self._buffer += payload
            line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            message: dict[str, Any] = json.loads(line)
            return message
        except ValueError:
            self._dead = True  # code in the sandbox wrote into the protocol: restart rather than trust it
            raise ResourceError("the sandbox wrote garbage into its control channel and was stopped") from None

    async def start(self) -> None:
        create = asyncio.ensure_future(asyncio.to_thread(self._create))
        try:
            await asyncio.shield(create)
        except BaseException:
            # Cancelled (e.g. the engine closing) while the thread creates the container: the thread runs
            # on regardless, so wait for it and remove what it made, or the container would outlive us.
            with contextlib.suppress(BaseException):
                await create
            await self.kill_async()
            raise
        try:
            hello = await asyncio.wait_for(asyncio.to_thread(self._read_line), self.ready_timeout)
        except BaseException:
            await self.kill_async()
            raise
        self.report = {**hello.get("isolation", {}), "network": "none (container)",
                       "filesystem": "container (read-only root, tmpfs workdir)", "user": "65534 (nobody)",
                       "image": self.image, "engine": self.engine_name}

    @property
    def engine_name(self) -> str | None:
        index = self.engine_index
        return None if index is None else self.engines.engines[index].name

    async def request(self, message: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        async with self.lock:
            if not self.alive:
                raise ResourceError("sandbox container is not running")
            data = json.dumps(message).encode() + b"\n"
            try:
                await asyncio.to_thread(self.raw.sendall, data)
                return await asyncio.wait_for(asyncio.to_thread(self._read_line), timeout)
            except (TimeoutError, asyncio.CancelledError):
                await self.kill_async()
                raise
            except OSError as exc:
                self._dead = True
                raise ResourceError(f"sandbox container stopped: {exc}") from exc

    def kill(self) -> None:
        """Remove the container (force: it is killed first). Safe to call more than once, from any thread: a
        second call waits for a removal already in flight, so "closed" always means "gone"."""
        self._dead = True
        with self._kill_lock:
            if self.socket is not None:
                with contextlib.suppress(Exception):
                    self.socket.close()
            if self.container is not None:
                with contextlib.suppress(Exception):
                    self.container.remove(force=True)
                self.container = None
            if self.engine_index is not None:  # the container is gone (or was never made): free its place
                self.engines.release(self.engine_index)
                self.engine_index = None

    async def kill_async(self) -> None:
        await asyncio.to_thread(self.kill)

    async def close(self) -> None:
        await self.kill_async()

    def kill_strays(self) -> int:
        return 0  # nothing outlives the container


# PID 1 of an exec container: reaps the orphans of finished commands (each would otherwise stay a zombie and
# count against the container's process limit) and waits. As PID 1 it gets no signal from inside the container.
REAPER = """
import os, signal
def reap(*_):
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
signal.signal(signal.SIGCHLD, reap)
while True:
    signal.pause()
"""


class ExecContainer:
    """A long-lived container that runs one command at a time, each a ``docker exec`` (a coding workspace's):
    its files persist between commands, and nothing else does (``run`` kills what a command left running).

    Created as nobody with no network, no capabilities, ``no-new-privileges``, memory, CPU and process limits
    on the container (cgroups), and a tmpfs ``/tmp``; the rest of its root is the image's, where nobody writes
    only what the image lets it (a workspace image has a world-writable ``/workspace``). ``commit`` freezes its
    files into an image, from which ``ExecContainer(image=...)`` makes copies: the docker backend's fork.
    Its calls block (the SDK's do): run them in worker threads.
    """

    USER = "65534:65534"  # the commands'
    KEEPER = "65533:65533"  # PID 1's: a uid no command runs as

    def __init__(self, image: str, *, limits: Limits, cpus: float = 1.0, tmp_bytes: int = 64 << 20,
                 engines: DockerEngines | None = None) -> None:
        self.image = image
        self.limits = limits
        self.cpus = cpus
        self.tmp_bytes = tmp_bytes
        self.engines = engines or DockerEngines()
        self.engine_index: int | None = None
        self.client: Any = None
        self.container: Any = None
        self.removed = False
        # Held by the whole of a creation: a removal (from another thread: a close, a cancelled start) waits for
        # it, so no container is made after its removal.
        self._lock = threading.RLock()

    @property
    def engine_name(self) -> str | None:
        index = self.engine_index
        return None if index is None else self.engines.engines[index].name

    def create(self, on: int | None = None) -> None:
        """Start the container, on engine ``on`` when given (a fork must run where its image is)."""
        with self._lock:
            if self.removed:
                raise ResourceError("the workspace was closed while its container was being made")
            self.engine_index, self.client = self.engines.place(on)
            self._make()

    def _make(self) -> None:
        try:
            require_image(self.client, self.image, self.engine_name or "the local engine")
            memory = self.limits.memory_bytes
            # Created, then started: a start that fails leaves a container this object holds and removes.
            self.container = self.client.containers.create(
                self.image, command=["python3", "-I", "-c", REAPER], user=self.KEEPER,
                network_mode="none", tmpfs={"/tmp": f"size={self.tmp_bytes},mode=1777"},
                # The container's processes together, as cgroups count them; each command also gets the
                # per-process limits (ulimit) in ``run``.
                mem_limit=None if memory is None else memory * 2,
                memswap_limit=None if memory is None else memory * 2,
                nano_cpus=int(self.cpus * 1e9),
                pids_limit=None if self.limits.processes is None else self.limits.processes + 2,
                cap_drop=["ALL"], security_opt=["no-new-privileges"],
                labels=labels())
            self.container.start()
        except BaseException:
            self.remove()
            raise

    def ulimits(self) -> str:
        """The shell's per-process limits for one command (the container's cgroup holds all of them together)."""
        lim = self.limits
        parts = [f"-t {lim.cpu_seconds}" if lim.cpu_seconds else "",
                 f"-v {lim.memory_bytes >> 10}" if lim.memory_bytes else "",
                 f"-n {lim.open_files}" if lim.open_files else "",
                 f"-f {lim.file_size_bytes >> 10}" if lim.file_size_bytes else ""]
        return " ".join(p for p in parts if p)

    def run(self, argv: list[str], stdin: bytes, env: dict[str, str], timeout: float,
            out: Any, err: Any | None = None) -> tuple[int | None, bool]:
        """Run ``argv`` as nobody with ``env``, feeding it ``stdin``; its stdout (and stderr, unless ``err``
        takes it) go to ``out.add(bytes)``. Returns (exit code, timed out); on a timeout every process of the
        command is killed. A container the engine lost raises ``ContainerGone``."""
        import socket
        import time

        import docker
        import requests

        api = self.client.api
        try:
            exec_id = api.exec_create(self.container.id, argv, stdin=True, stdout=True, stderr=True,
                                      user=self.USER, environment=env)["Id"]
            sock = api.exec_start(exec_id, socket=True)
        except (docker.errors.APIError, requests.exceptions.RequestException, OSError) as exc:
            raise ContainerGone(*self.end()) from exc
        raw = getattr(sock, "_sock", sock)
        deadline = time.monotonic() + timeout
        timed_out = False
        try:
            if stdin:
                raw.sendall(stdin)
            raw.shutdown(socket.SHUT_WR)  # the command's stdin ends here
            buffer = b""
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                raw.settimeout(left)
                try:
                    chunk = raw.recv(65536)
                except TimeoutError:
                    timed_out = True
                    break
                if not chunk:
                    break
                buffer += chunk
                # Without a TTY docker multiplexes the streams: 8-byte header (stream, 0, 0, 0, big-endian size).
                while len(buffer) >= 8:
                    stream, size = struct.unpack(">BxxxL", buffer[:8])
                    if len(buffer) < 8 + size:
                        break
                    payload, buffer = buffer[8:8 + size], buffer[8 + size:]
                    (err if stream == 2 and err is not None else out).add(payload)
        except OSError as exc:
            raise ContainerGone(*self.end()) from exc
        finally:
            with contextlib.suppress(OSError):
                sock.close()
        if timed_out:
            self.kill_commands()
            return None, True
        try:
            code = api.exec_inspect(exec_id).get("ExitCode")
        except (docker.errors.APIError, requests.exceptions.RequestException) as exc:
            raise ContainerGone(*self.end()) from exc
        # A command SIGKILLed, or a stream that ended before the engine recorded an exit: the container itself
        # may be going (removed, killed from outside, its engine stopping), which the engine records a moment
        # after the command's end.
        if code in (None, 137) and not self.stays(1.0):
            raise ContainerGone(*self.end())
        return (int(code) if code is not None else None), False

    def kill_commands(self) -> None:
        """SIGKILL every command's process (``kill -1`` as the commands' uid: PID 1 is another's)."""
        with contextlib.suppress(Exception):
            self.client.api.exec_start(
                self.client.api.exec_create(self.container.id, ["kill", "-9", "-1"], user=self.USER)["Id"])

    def commit(self) -> str:
        """The container's files as a new image (its id); the container pauses while the engine copies them."""
        image = self.container.commit(repository="agentfly-workspace-fork", tag=f"x{id(self):x}{time_ns():x}",
                                      conf={"Labels": labels()})
        return str(image.id)

    def put_archive(self, path: str, tar: bytes) -> None:
        if not self.container.put_archive(path, tar):
            raise ResourceError(f"the docker engine refused the files for {path}")

    def stays(self, seconds: float) -> bool:
        """Whether the container is still running after ``seconds`` (False as soon as it stops)."""
        import requests

        if self.container is None:
            return False
        try:
            self.container.wait(timeout=seconds)
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            return self.alive()
        except Exception:
            return False
        return False

    def alive(self) -> bool:
        if self.container is None:
            return False
        try:
            self.container.reload()
        except Exception:
            return False
        return bool(self.container.attrs.get("State", {}).get("Running"))

    def end(self) -> tuple[str | None, str]:
        """Why the container stopped (``container_end``): removed or killed from outside, or its engine gone,
        is the infrastructure's failure (a kind); anything else (its memory limit's OOM kill) is the doing of
        the code inside (None), which a command cannot otherwise bring about: PID 1 runs under a uid of its own
        that the commands can neither signal nor trace."""
        if self.container is None:
            return "killed", "the workspace's container was removed"
        kind, why = container_end(self.container, self.engine_name)
        return kind, why or "the workspace's container stopped"

    def remove(self) -> None:
        """Remove the container (killed first); safe to call more than once, from any thread."""
        with self._lock:
            self.removed = True
            if self.container is not None:
                with contextlib.suppress(Exception):
                    self.container.remove(force=True)
                self.container = None
            if self.engine_index is not None:
                self.engines.release(self.engine_index)
                self.engine_index = None

    @staticmethod
    def remove_images(client: Any, images: list[str]) -> None:
        """Remove fork images, newest first (a later one is built on an earlier). The engine may refuse while
        a removed container's last layer is still being let go: each is tried again for a few seconds, and one
        still refused is logged with its id (``docker image rm`` removes it)."""
        import time

        for image in reversed(images):
            for attempt in range(10):
                try:
                    client.images.remove(image, force=True)
                    break
                except Exception as exc:
                    if type(exc).__name__ == "ImageNotFound":
                        break
                    if attempt == 9:
                        log.warning("could not remove the workspace fork image %s: %s", image, exc)
                    else:
                        time.sleep(0.5)


class ContainerGone(Exception):
    """The container stopped under a command: (kind, why) of ``ExecContainer.end``."""


# ---------------------------------------------------------------------------------- an image without a registry
_SKIP_STDLIB = {"test", "tests", "__pycache__", "site-packages", "dist-packages", "idlelib", "tkinter",
                "turtledemo", "ensurepip", "lib2to3"}


def _shared_libraries(paths: list[str]) -> set[str]:
    """Every shared library the given binaries load, as ``ldd`` reports it."""
    import re
    import subprocess

    found: set[str] = set()
    for path in paths:
        out = subprocess.run(["ldd", path], capture_output=True, text=True, check=False).stdout
        found.update(re.findall(r"(/\S+\.so[\w.]*)", out))
    return found


def build_image(tag: str = "agentfly-python:local") -> str:
    """Make a sandbox image from this machine's own Python (binary, standard library, shared libraries)
    and ``docker import`` it: for machines where images cannot be pulled. Returns the tag."""
    import io
    import os
    import sys
    import sysconfig
    import tarfile
    import tempfile

    import docker

    exe = os.path.realpath(sys.executable if sys.prefix == sys.base_prefix
                           else getattr(sys, "_base_executable", sys.executable))
    stdlib = sysconfig.get_paths()["stdlib"]
    dynload = os.path.join(stdlib, "lib-dynload")
    binaries = [exe] + [os.path.join(dynload, f) for f in os.listdir(dynload) if f.endswith(".so")]
    with tempfile.NamedTemporaryFile(suffix=".tar") as tmp:
        with tarfile.open(tmp.name, "w") as tar:
            def add_dir(name: str) -> None:
                info = tarfile.TarInfo(name.lstrip("/"))
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)

            def skip(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
                return None if set(info.name.split("/")) & _SKIP_STDLIB else info

            files = [*sorted(_shared_libraries(binaries)), exe]
            # Every ancestor as an explicit 0755 directory: implicit ones may come out unreadable to nobody
            # (e.g. a Python under /root).
            parents = {os.path.dirname(p) for p in [*files, stdlib]}
            parents |= {"/tmp", "/work", "/etc", "/proc", "/dev", "/sys", "/usr/bin"}
            for path in list(parents):
                while path not in ("/", ""):
                    parents.add(path)
                    path = os.path.dirname(path)
            for d in sorted(parents):
                add_dir(d)
            for lib in files:
                tar.add(os.path.realpath(lib), arcname=lib.lstrip("/"))
            tar.add(stdlib, arcname=stdlib.lstrip("/"), filter=skip)
            for name in ("python", "python3"):
                link = tarfile.TarInfo(f"usr/bin/{name}")
                link.type, link.linkname = tarfile.SYMTYPE, exe
                tar.addfile(link)
            passwd = b"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            info = tarfile.TarInfo("etc/passwd")
            info.size = len(passwd)
            tar.addfile(info, io.BytesIO(passwd))
        repository, _, version = tag.partition(":")
        docker.from_env().api.import_image_from_file(tmp.name, repository=repository, tag=version or "latest")
    return tag


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Build a sandbox image from this machine's Python, offline.")
    parser.add_argument("--build-image", metavar="TAG", default="agentfly-python:local")
    args = parser.parse_args(argv)
    print(build_image(args.build_image))
    print(f"use it with AGENTFLY_SANDBOX_IMAGE={args.build_image} or PythonSandbox(backend='docker', image=...)")


if __name__ == "__main__":
    main()
