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
import contextlib
import json
import os
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from agentfly.resources.backends.local import WORKER, Limits
from agentfly.resources.spec import ResourceError

DEFAULT_IMAGE = os.environ.get("AGENTFLY_SANDBOX_IMAGE", "python:3.11-slim")


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
            return docker.from_env(timeout=int(self.timeout))
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
                                     version=docker.constants.MINIMUM_DOCKER_API_VERSION)
        client.api.trust_env = False
        client.api._version = client.api._retrieve_server_version()
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

    def place(self) -> tuple[int, Any]:
        """Reserve room on the engine with the most left; returns (index, client). Raises when all are full."""
        with self._lock:
            def room(i: int) -> float:
                limit = self.engines[i].max
                return float("inf") if limit is None else limit - self.in_use[i]

            best = max(range(len(self.engines)), key=lambda i: (room(i), -self.in_use[i]))
            if room(best) <= 0:
                usage = ", ".join(f"{e.name} {n}/{e.max}" for e, n in zip(self.engines, self.in_use, strict=True))
                raise ResourceError(
                    f"every docker engine of this pool is at its limit ({usage}); lower the pool's max to the sum "
                    "of the engines' max, or add an engine"
                )
            self.in_use[best] += 1
            if best not in self._clients:
                try:
                    self._clients[best] = self.engines[best].client()
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
        """How the container that stopped answering ended, as the engine records it (``State``):

        - ended by a signal the engine sent (its ``kill`` event: ``docker kill``/``stop``/``rm -f`` by someone
          else, the engine shutting down): ``killed``. The code in the sandbox cannot do this to itself: the
          worker is the container's PID 1, which ignores every signal sent from inside its PID namespace, and an
          ``os._exit(137)``, which the engine records as the same status, comes with no ``kill`` event.
        - removed while it ran (the engine no longer knows it): ``killed``.
        - the engine does not answer: ``server_down`` (the host or its daemon went away).
        - OOM-killed by its own memory limit, or exited by itself (``os._exit``, a crash): None, the sandbox's
          own doing, an observation the model reads.
        """
        import docker
        import requests

        container = self.container
        if container is None:  # we removed it ourselves: a timeout, a reset, close
            return None, ""
        engine = self.engine_name or "the local engine"
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
        if code in (137, 143) and self._engine_killed(container, state):
            by = "SIGKILLed" if code == 137 else "SIGTERMed"
            return "killed", f"its container was {by} from outside (on {engine})"
        return None, f"it exited with status {code}"

    @staticmethod
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

    def _create(self) -> None:
        import docker

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
        try:
            client.images.get(self.image)
        except docker.errors.ImageNotFound as exc:
            raise ResourceError(
                f"docker image {self.image!r} is not present on {self.engines.engines[self.engine_index or 0].name}; "
                f"run `docker pull {self.image}` there first (the sandbox has no network to pull it at run time)"
            ) from exc
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
            labels={"agentfly.sandbox": "1"},
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
