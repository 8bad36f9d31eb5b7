"""The ``docker`` backend: a sandbox is a container, driven over the same JSON-lines worker protocol.

Each container runs ``python -c <_worker.py>`` from a stock Python image (nothing to build), as user
nobody, with ``network_mode="none"``, a read-only root filesystem, a small tmpfs as its working directory,
memory, CPU and process limits, and it is removed when the sandbox closes (and, for sandboxes, on every
release: a fresh container per rollout). The protocol runs over the container's attached stdin/stdout.

The SDK's calls block, so they run in worker threads; a reply that does not come in time gets the
container killed, which also unblocks the reading thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import struct
import threading
from typing import Any

from agentfly.resources.backends.local import WORKER, Limits
from agentfly.resources.spec import ResourceError

DEFAULT_IMAGE = os.environ.get("AGENTFLY_SANDBOX_IMAGE", "python:3.11-slim")


class DockerWorker:
    """One container speaking the worker protocol; the same interface as ``LocalWorker``."""

    def __init__(self, limits: Limits | None = None, image: str | None = None, cpus: float = 1.0,
                 tmpfs_size: str = "64m", ready_timeout: float = 120.0) -> None:
        self.limits = limits or Limits()
        self.image = image or DEFAULT_IMAGE
        self.cpus = cpus
        self.tmpfs_size = tmpfs_size
        self.ready_timeout = ready_timeout
        self.container: Any = None
        self.socket: Any = None
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

    def _create(self) -> None:
        import docker

        client = docker.from_env()
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
                f"docker image {self.image!r} is not present; run `docker pull {self.image}` first (the sandbox "
                "has no network to pull it at run time)"
            ) from exc
        self.container = client.containers.create(
            self.image,
            command=["python", "-I", "-c", WORKER.read_text()],
            environment={"AGENTFLY_SANDBOX": json.dumps(config), "HOME": self.workdir, "TMPDIR": self.workdir},
            stdin_open=True,
            tty=False,
            user="65534:65534",
            working_dir=self.workdir,
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
        self.container.start()

    def _recv_exact(self, n: int) -> bytes:
        raw = self.socket._sock
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
                       "image": self.image}

    async def request(self, message: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        async with self.lock:
            if not self.alive:
                raise ResourceError("sandbox container is not running")
            data = json.dumps(message).encode() + b"\n"
            try:
                await asyncio.to_thread(self.socket._sock.sendall, data)
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
