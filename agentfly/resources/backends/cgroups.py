"""A control group of its own for one job (or sandbox): memory, CPU and process limits that its processes
cannot leave, however many they start or however they detach.

cgroup v2 is used where it has the controllers (``/sys/fs/cgroup/cgroup.controllers``, or the hybrid
``/sys/fs/cgroup/unified``), else the v1 hierarchies ``memory``, ``pids`` and ``cpu``. The group is made below
the cgroup this process runs in (``/proc/self/cgroup``), as ``agentfly/<name>``. Where no cgroup can be made
(no permission, no controller), ``Cgroup.create`` returns None and the caller falls back to rlimits with the
same numbers: RLIMIT_AS for memory and RLIMIT_NPROC for processes; CPU then has no limit, which the report says.
RLIMIT_NPROC counts every task of a uid in a user namespace, so where the job runs in a user namespace of its
own (a non-root worker's sandbox) the limit is set inside it (``limit_argv``), where it counts the job's
processes alone; set before the namespace is made, it would count every process of the worker's uid (the
worker, its other jobs, and in a container every container of that uid: a Ray node holds hundreds of threads)
and refuse the job its first threads. A root worker's job runs as its team's uid (``rlimits``, in the child
between fork and exec): the limit is then shared by that team's jobs on the host.

Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
V1 = ("memory", "pids", "cpu")
PERIOD_US = 100_000


@dataclass(frozen=True)
class ResourceLimits:
    """What one job may use (None: no limit).

    Attributes:
        memory_bytes: resident memory of all its processes together; past it the kernel kills one (OOM).
        cpus: CPU time per wall-clock second, in cores (1.5 = one and a half cores).
        processes: processes and threads alive at once; a fork past it fails (EAGAIN).
    """

    memory_bytes: int | None = None
    cpus: float | None = None
    processes: int | None = None


def _v2_root() -> Path | None:
    for candidate in (ROOT, ROOT / "unified"):
        try:
            if {"memory", "pids"} <= set((candidate / "cgroup.controllers").read_text().split()):
                return candidate
        except OSError:
            continue
    return None


def _own(controller: str) -> str:
    """This process's cgroup in ``controller``'s hierarchy ("" for v2's), from /proc/self/cgroup."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    raise OSError(f"no {controller} cgroup for this process")


class Cgroup:
    """One job's control group (see the module docstring). ``join`` moves the calling process into it (run it
    in the child between fork and exec); ``kill`` ends every process in it; ``remove`` deletes it."""

    def __init__(self, folders: list[Path], version: int, limits: ResourceLimits) -> None:
        self.folders, self.version, self.limits = folders, version, limits

    @classmethod
    def create(cls, name: str, limits: ResourceLimits) -> Cgroup | None:
        """Make the group ``agentfly/<name>`` with ``limits``; None when this host lets us make none."""
        try:
            v2 = _v2_root()
            if v2 is not None:
                folder = v2 / _own("").lstrip("/") / "agentfly" / name
                folder.mkdir(parents=True, exist_ok=True)
                group = cls([folder], 2, limits)
            else:
                folders = []
                for controller in V1:
                    folder = ROOT / controller / _own(controller).lstrip("/") / "agentfly" / name
                    folder.mkdir(parents=True, exist_ok=True)
                    folders.append(folder)
                group = cls(folders, 1, limits)
            group._limit()
            return group
        except OSError:
            return None

    def _write(self, name: str, value: str) -> None:
        for folder in self.folders:
            if (folder / name).exists():
                (folder / name).write_text(value)
                return
        raise OSError(f"no {name} in {self.folders}")

    def _limit(self) -> None:
        memory, cpus, processes = self.limits.memory_bytes, self.limits.cpus, self.limits.processes
        if self.version == 2:
            self._write("memory.max", str(memory) if memory else "max")
            with contextlib.suppress(OSError):
                self._write("memory.swap.max", "0" if memory else "max")  # no escape into swap
            self._write("pids.max", str(processes) if processes else "max")
            with contextlib.suppress(OSError):  # the cpu controller may be off where memory and pids are on
                self._write("cpu.max", f"{int(cpus * PERIOD_US)} {PERIOD_US}" if cpus else f"max {PERIOD_US}")
        else:
            self._write("memory.limit_in_bytes", str(memory) if memory else "-1")
            with contextlib.suppress(OSError):
                self._write("memory.memsw.limit_in_bytes", str(memory) if memory else "-1")
            self._write("pids.max", str(processes) if processes else "max")
            self._write("cpu.cfs_period_us", str(PERIOD_US))
            self._write("cpu.cfs_quota_us", str(int(cpus * PERIOD_US)) if cpus else "-1")

    def join(self) -> None:
        """Move the calling process (and so everything it starts) into the group."""
        for folder in self.folders:
            (folder / "cgroup.procs").write_text(str(os.getpid()))

    def pids(self) -> list[int]:
        found: set[int] = set()
        for folder in self.folders:
            with contextlib.suppress(OSError):
                found.update(int(p) for p in (folder / "cgroup.procs").read_text().split())
        return sorted(found)

    def oom_kills(self) -> int:
        """How many processes the kernel killed for the memory limit."""
        for folder in self.folders:
            for name in ("memory.events", "memory.oom_control"):
                with contextlib.suppress(OSError):
                    for line in (folder / name).read_text().splitlines():
                        key, _, value = line.partition(" ")
                        if key == "oom_kill":
                            return int(value)
        return 0

    def kill(self) -> None:
        """SIGKILL every process in the group, until it is empty (a fork bomb keeps forking meanwhile)."""
        for _ in range(50):
            alive = self.pids()
            if not alive:
                return
            for pid in alive:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)

    def remove(self) -> None:
        self.kill()
        for folder in self.folders:
            for _ in range(20):  # the kernel empties the group a moment after the last process is reaped
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)

    def describe(self) -> str:
        return f"cgroup v{self.version} ({', '.join(str(f) for f in self.folders)})"


# The fallback where no cgroup can be made: each limit, the rlimit that stands for it, and prlimit's flag for it.
# Memory becomes address space; CPU has no rlimit of this kind.
RLIMITS = (("memory_bytes", resource.RLIMIT_AS, "--as"), ("processes", resource.RLIMIT_NPROC, "--nproc"))


def _set(limits: ResourceLimits) -> list[tuple[int, str, int]]:
    """(rlimit, prlimit flag, value) of every limit ``limits`` sets that has an rlimit."""
    return [(which, flag, value) for name, which, flag in RLIMITS if (value := getattr(limits, name))]


def rlimits(limits: ResourceLimits) -> None:
    """``RLIMITS`` of the calling process (run it in the child between fork and exec): RLIMIT_NPROC counts every
    process of the uid (see the module docstring)."""
    for which, _, value in _set(limits):
        resource.setrlimit(which, (value, value))


def limit_argv(limits: ResourceLimits) -> list[str]:
    """``prlimit`` (util-linux) setting ``RLIMITS``, to put before a command: the process that then execs it sets
    them, so inside a user namespace RLIMIT_NPROC counts that namespace's processes alone (see the module
    docstring). Empty when ``limits`` sets no rlimit."""
    flags = [f"{flag}={value}" for _, flag, value in _set(limits)]
    if not flags:
        return []
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        raise OSError("prlimit (util-linux) is not installed: it sets a job's memory and process limits where the "
                      "host gives no cgroup (apt-get install util-linux)")
    return [prlimit, *flags, "--"]
