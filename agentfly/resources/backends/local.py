"""The ``local`` backend: a resource instance is a child process we own, talked to in JSON lines.

The child runs in a new session (its own process group) so that ``kill`` takes it and everything it
started; when it runs under a private uid (root parents only, see ``_worker.harden``) every process of that
uid is killed too, which catches children that left the group with ``setsid``. Limits, the network
namespace and the filesystem rules are applied by the child itself before it reads its first request.

Nothing is left behind when the parent dies without cleaning up (SIGKILL, OOM): the child asks the kernel
for SIGKILL when its parent goes (``PR_SET_PDEATHSIG``), and every sandbox's folder is made under one root,

    sandbox_root()/<owner pid>-<owner start time>-<random>/
        pid     the sandbox process (pid, start time, private uid), written by the parent
        work/   the sandbox's working directory, the only place it may write

so ``sweep_sandboxes()`` (run when a ResourceEngine or a web-app worker starts) can find the folders of
owners that are gone, kill what their sandboxes left running and remove the folders.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import site
import stat
import struct
import sys
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agentfly.resources.backends._worker import others_can_read
from agentfly.resources.spec import ResourceError

WORKER = Path(__file__).resolve().with_name("_worker.py")
WORKER_ARG = str(WORKER)
# Every worker started and not yet killed, so that interpreter exit and SIGTERM can stop the ones nobody
# closed (a sandbox used without an engine, an engine that was dropped without aclose()).
_live_workers: set[LocalWorker] = set()


def kill_all_workers() -> None:
    for worker in list(_live_workers):
        with contextlib.suppress(Exception):
            worker.kill()


atexit.register(kill_all_workers)
STREAM_LIMIT = 64 * 1024 * 1024  # one protocol line may carry a long output


@dataclass(frozen=True)
class Limits:
    """Per-process resource limits of a sandbox (``None`` leaves one unset).

    Attributes:
        cpu_seconds: CPU time over the sandbox's life (RLIMIT_CPU); a reset past half of it replaces the process.
        memory_bytes: address space (RLIMIT_AS); an allocation beyond it raises MemoryError in the sandbox.
        open_files: file descriptors (RLIMIT_NOFILE).
        file_size_bytes: the largest file it may write (RLIMIT_FSIZE).
        processes: processes and threads (RLIMIT_NPROC); counted per sandbox when it gets a private uid.
    """

    cpu_seconds: int | None = 300
    memory_bytes: int | None = 1 << 30
    open_files: int | None = 256
    file_size_bytes: int | None = 64 << 20
    processes: int | None = 32


@dataclass(frozen=True)
class Isolation:
    """What a local sandbox is cut off from.

    Attributes:
        network: "none" (a fresh network namespace where the kernel allows) or "host".
        filesystem: "restricted" (a root of its own made by bubblewrap, holding only what ``sandbox_view``
            lists: the Python installation and system libraries and ``read_paths`` read-only, the working
            directory read-write, a private /proc and a minimal /dev; no host socket, /run, /tmp or /etc;
            Landlock on top) or "host" (trusted code only). "restricted" refuses to start without bubblewrap.
        own_uid: run as a private uid when the parent is root, so limits and kills are per sandbox.
        read_paths: extra paths the sandbox may read (data you give it).
    """

    network: str = "none"
    filesystem: str = "restricted"
    own_uid: bool = True
    read_paths: tuple[str, ...] = ()


def project_roots() -> list[str]:
    """Folders a sandbox must never read: the working directory and the source tree AgentFly runs from
    (when it is not installed into site-packages), where settings, ``.git`` and databases live."""
    roots = {os.path.realpath(".")}
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__)))))
    installed = {os.path.realpath(p) for p in (sysconfig.get_paths().get("purelib"), sysconfig.get_paths().get("platlib")) if p}
    if package not in installed:
        roots.add(package)
    return sorted(roots)


def _overlaps(path: str, roots: list[str]) -> bool:
    """Is ``path`` one of ``roots``, or a folder above one (granting it would grant the root too)?"""
    real = os.path.realpath(path)
    return any(real == root or root.startswith(real.rstrip(os.sep) + os.sep) for root in roots)


def runtime_read_paths() -> list[str]:
    """What an interpreter needs to read to import modules: its installation and the shared libraries.

    Not ``sys.path``: the sandboxed interpreter runs with ``-I`` (no PYTHONPATH, no script folder), and the
    parent's ``sys.path`` holds the project root whenever PYTHONPATH, an editable install or ``celery -A``
    put it there. Nothing that is or contains the working directory or the project root is granted; a venv
    inside the project stays readable through its own site-packages, not through the project folder.
    """
    config = sysconfig.get_paths()
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    paths.update(config[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in config)
    paths.update(site.getsitepackages())
    paths.update(["/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/local/lib", "/usr/share/zoneinfo", "/bin", "/usr/bin",
                  "/usr/share/git-core", "/etc/ld.so.cache", "/etc/localtime"])
    roots = project_roots()
    return sorted(p for p in paths if os.path.exists(p) and not _overlaps(p, roots))


def sandbox_view(isolation: Isolation, workdir: str, program: Sequence[str] = ()) -> dict[str, str]:
    """Everything of the host's filesystem a local sandbox sees, ``{path: "ro" | "rw"}``: the one place that
    says it. Deny by default: with ``filesystem="restricted"`` the sandbox's root holds these paths and
    nothing else (plus a /proc of its own process namespace and bubblewrap's minimal /dev), so no host
    socket (PostgreSQL's, Redis's, Docker's, D-Bus, systemd) exists there to connect to, and its own network
    namespace leaves it no abstract socket and no TCP. Landlock then allows the same paths again, inside.
    ``program``: the files of the program it runs (the worker script), read-only."""
    view = {path: "ro" for path in runtime_read_paths()}
    view.update({os.path.abspath(path): "ro" for path in (*isolation.read_paths, *program)})
    view[os.path.abspath(workdir)] = "rw"
    return view


class SandboxUnavailable(ResourceError):
    """The sandbox cannot be confined as asked (no bubblewrap, or no namespaces); the message names the fix."""


def refuse_unreadable(view: dict[str, str]) -> None:
    """Raise ``SandboxUnavailable`` naming each read-only path of ``view`` that other users cannot read.

    A sandbox started by root runs as a private uid with no capability at all, so it reads only what any
    user may read. The folders above a bound path do not matter (bubblewrap makes them, traversable, in the
    sandbox's root: a Python installation under a 0700 /root is fine); the path itself does.
    """
    unreadable = [p for p, mode in view.items() if mode == "ro" and os.path.exists(p)
                  and not others_can_read(p, ancestors=False)]
    if unreadable:
        raise SandboxUnavailable(
            f"a sandbox runs as a uid of its own without capabilities, and cannot read {', '.join(unreadable)}: "
            "make each readable by other users (chmod -R o+rX PATH; for a virtual environment, create it with "
            "umask 022), or give the sandbox a copy that is")


NO_BWRAP = ("a local sandbox needs bubblewrap (`bwrap`) to hide the host's sockets and files from untrusted code, "
            "and {reason}. Install it (apt-get install bubblewrap) and allow namespaces (run the worker as root, or "
            "as a user that may create user namespaces: sysctl kernel.unprivileged_userns_clone=1, and on Ubuntu "
            "kernel.apparmor_restrict_unprivileged_userns=0). Only for trusted code: Isolation(filesystem='host').")


def _layout(view: dict[str, str]) -> tuple[list[str], list[str]]:
    """The folders bubblewrap makes in the sandbox's root to hold ``view``'s paths (they contain nothing
    else), and the mount arguments of those paths."""
    mounts: list[str] = []
    folders: set[str] = set()
    bound: list[str] = []
    for path in sorted(view, key=lambda p: (p.count(os.sep), p)):
        if any(path == b or path.startswith(b.rstrip(os.sep) + os.sep) for b in bound):
            continue  # already inside a bound folder
        parent = os.path.dirname(path)
        while parent not in ("/", "") and not any(parent == b or parent.startswith(b + os.sep) for b in bound):
            folders.add(parent)
            parent = os.path.dirname(parent)
        if os.path.islink(path) and os.path.dirname(path) == "/":
            mounts += ["--symlink", os.readlink(path), path]  # /bin -> usr/bin stays a link
            continue
        # A read-only path that is gone by the time bubblewrap starts (a plugin folder removed meanwhile) is
        # left out rather than failing the start; a writable one must be there.
        mounts += ["--bind" if view[path] == "rw" else "--ro-bind-try", path, path]
        bound.append(path)
    return sorted(folders, key=lambda p: (p.count(os.sep), p)), mounts


def bwrap_argv(view: dict[str, str], workdir: str, network: str, proc: bool = True,
               as_pid_1: bool = False) -> list[str]:
    """The bubblewrap command line that builds a root of ``view`` alone (see ``sandbox_view``); ``proc=False``
    leaves out the root's /proc (a bubblewrap nested in a job's sandbox may not mount one: the kernel refuses
    a procfs below one with covered parts, such as bubblewrap's read-only /proc/sys). ``as_pid_1`` runs the
    program as PID 1 of its process namespace, where the kernel drops every signal its own processes send it
    that it has no handler for, SIGKILL included (see ``LocalWorker.ended``)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(NO_BWRAP.format(reason="`bwrap` is not on PATH"))
    # --new-session: the program's own session and process group. In bubblewrap's (this process's child's),
    # a ``kill(0, SIGKILL)`` inside reached bubblewrap's own process outside the namespace.
    argv = [bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try"]
    if as_pid_1:
        argv.append("--as-pid-1")
    if network == "none":
        argv.append("--unshare-net")
    if os.geteuid() != 0:
        argv.append("--unshare-user")  # root keeps its uid: the worker moves to a private one itself
    folders, mounts = _layout(view)
    # Intermediate folders bubblewrap makes are 0700; the sandbox's private uid must traverse them.
    for folder in folders:
        argv += ["--perms", "0755", "--dir", folder]
    argv += mounts
    argv += [*(["--proc", "/proc"] if proc else []), "--dev", "/dev", "--dir", SANDBOX_MARK, "--chdir", workdir, "--"]
    return argv


# A folder only our bubblewrap roots have (only root could make it on a host): a sandbox started from inside
# one (a "try it" child running a tool's own sandbox) is already in a root of its parent's view, where
# Landlock forbids the mounts a second bubblewrap would need; it applies the other steps inside it.
SANDBOX_MARK = "/.agentfly-sandbox"


def inside_sandbox() -> bool:
    return os.path.isdir(SANDBOX_MARK)


# --------------------------------------------------------------------------- sandbox folders and the sweep
def sandbox_root() -> Path:
    """Where every sandbox folder of this user is made: ``AGENTFLY_SANDBOX_DIR``, by default
    ``<tempdir>/agentfly-sandboxes-<uid>`` (one per uid, so users on one machine never share one)."""
    default = Path(tempfile.gettempdir()) / f"agentfly-sandboxes-{os.geteuid()}"
    root = Path(os.environ.get("AGENTFLY_SANDBOX_DIR") or default)
    root.mkdir(mode=0o711, parents=True, exist_ok=True)
    info = os.lstat(root)
    # In a shared /tmp another user could have made the folder (or a symlink) first to watch or plant files.
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise ResourceError(f"the sandbox folder {root} is not a directory owned by uid {os.geteuid()}; remove it, "
                            "or point AGENTFLY_SANDBOX_DIR at a folder of your own")
    # Traversable (not listable) by others: a sandbox under a private uid must reach its own work/.
    os.chmod(root, 0o711)
    return root


def _stat(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` after the command name (field 3, the state, first); None when ``pid`` is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), so a reused pid is never mistaken for the original."""
    fields = _stat(pid)
    return int(fields[19]) if fields and fields[0] not in ("Z", "X") else None


def cpu_seconds(pid: int) -> float | None:
    """The CPU time ``pid`` has used so far, all its threads together (None when it is gone)."""
    fields = _stat(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# PIDFD_GET_INFO (Linux 6.15): _IOWR(0xFF, 11, struct pidfd_info), of which the first 64 bytes are asked for;
# with PIDFD_INFO_EXIT the kernel keeps a process's wait status for whoever holds a pidfd of it, after any
# parent reaped it. ``exit_code`` sits at byte 60.
PIDFD_GET_INFO = 0xC040FF0B
PIDFD_INFO_EXIT = 0x8


def reaped_status(pidfd: int) -> int | None:
    """The wait status (``os.WIFSIGNALED`` and the rest read it) of the process behind ``pidfd`` once its
    parent reaped it; None while it runs, or where the kernel keeps none (before Linux 6.15)."""
    info = bytearray(64)
    struct.pack_into("Q", info, 0, PIDFD_INFO_EXIT)
    try:
        fcntl.ioctl(pidfd, PIDFD_GET_INFO, info, True)
    except OSError:
        return None
    if not struct.unpack_from("Q", info, 0)[0] & PIDFD_INFO_EXIT:
        return None
    status: int = struct.unpack_from("i", info, 60)[0]
    return status


def make_sandbox_folder() -> Path:
    """A fresh folder for one sandbox, named after its owner (this process) so a sweep knows when it is dead."""
    folder = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-{start_time(os.getpid()) or 0}-", dir=sandbox_root()))
    folder.chmod(0o711)
    (folder / "work").mkdir(mode=0o700)
    return folder


def _owner_alive(name: str) -> bool:
    pid, _, rest = name.partition("-")
    started, _, _ = rest.partition("-")
    if not (pid.isdigit() and started.isdigit()):
        return True  # not ours to judge: leave it
    return process_alive(int(pid), int(started))


def process_alive(pid: int, started: int) -> bool:
    """Whether process ``pid`` that started at ``started`` (``start_time``; 0: unknown) still runs, and is
    not another process that got its pid since."""
    if started == 0:  # no /proc when it was recorded (not Linux): the pid is all we know
        try:
            os.kill(pid, 0)
        except PermissionError:
            return True  # alive, another user's
        except (ProcessLookupError, OverflowError):
            return False
        return True
    return start_time(pid) == started


def _sessions() -> dict[int, list[tuple[int, int]]]:
    """Live processes by session id: ``{sid: [(pid, start time)]}``."""
    found: dict[int, list[tuple[int, int]]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] not in ("Z", "X"):
            found.setdefault(int(fields[3]), []).append((int(entry), int(fields[19])))
    return found


def _kill_leftovers(folder: Path, sessions: dict[int, list[tuple[int, int]]]) -> int:
    """Kill what the sandbox of ``folder`` left running: itself if alive, its session, its private uid."""
    try:
        record = json.loads((folder / "pid").read_text())
        pid, started = int(record["pid"]), int(record["start"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0
    now = start_time(pid)
    if now is not None and now != started:
        return 0  # the pid went to another process: its session is not the sandbox's
    # The sandbox ran in a session of its own (start_new_session), and while one member lives the kernel keeps
    # the session's id from being reused, so members started after the sandbox are its descendants.
    victims = [p for p, t in sessions.get(pid, []) if t >= started]
    for victim in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(victim, signal.SIGKILL)
    uid = record.get("uid")
    if isinstance(uid, int) and uid == 100000 + pid:  # the private uid drop_privileges gives (root parents)
        return len(victims) + kill_uid(uid)
    return len(victims)


def remove_tree(path: Path) -> None:
    """``rm -rf``, also through folders the sandbox made read-only."""
    def unlock(function: Any, name: str, exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(name), 0o700)
            if os.path.isdir(name) and not os.path.islink(name):
                os.chmod(name, 0o700)
                shutil.rmtree(name, ignore_errors=True)
            else:
                os.unlink(name)

    shutil.rmtree(path, onerror=unlock)


def sweep_sandboxes(root: Path | None = None) -> list[Path]:
    """Remove the sandbox folders whose owner process is dead, after killing what their sandboxes left
    running; return the folders removed. Cheap when nothing is left over (one directory listing)."""
    root = root or sandbox_root()
    try:
        dead = [Path(e.path) for e in os.scandir(root) if e.is_dir(follow_symlinks=False) and not _owner_alive(e.name)]
    except OSError:
        return []
    if dead:
        sessions = _sessions()
        for folder in dead:
            _kill_leftovers(folder, sessions)
            remove_tree(folder)
    return [folder for folder in dead if not folder.exists()]


class LocalWorker:
    """One child process speaking the worker protocol. Requests are serialised (one at a time)."""

    def __init__(
        self,
        argv: list[str] | None = None,
        *,
        limits: Limits | None = None,
        isolation: Isolation | None = None,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        harden: bool = True,
        ready_timeout: float = 60.0,
    ) -> None:
        self.argv = argv or [sys.executable, "-I", str(WORKER)]
        self.limits = limits or Limits()
        self.isolation_config = isolation or Isolation()
        self.extra_env = env or {}
        self.own_workdir = workdir is None
        self.workdir = workdir
        self.folder: Path | None = None  # the sandbox's folder under sandbox_root(), when we made it
        self.harden = harden
        self.ready_timeout = ready_timeout
        self.proc: asyncio.subprocess.Process | None = None
        self.pid: int | None = None
        self.uid: int | None = None
        self.report: dict[str, Any] = {}
        self.lock = asyncio.Lock()
        self.killed_by_us = False
        self.launcher: str | None = None  # "bwrap" when the process is bubblewrap, with the worker below it
        self.worker_pid: int | None = None  # the worker's pid (below bubblewrap's), as the host sees it
        self.pidfd: int | None = None  # the worker's, which keeps its exact wait status (``worker_status``)
        self.status: int | None = None  # that status, once read
        # The worker's CPU seconds and the monotonic clock when the last request was sent (``ended``).
        self.cpu_mark: tuple[float, float] | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def exit_code(self) -> int | None:
        """The worker's exit status as ``Popen.returncode`` gives it. Bubblewrap reports a worker killed by a
        signal as 128 + the signal, as it does one that exited with that number: the worker's own wait status
        (``worker_status``) tells which; where the kernel keeps none, 128 + N is read as signal N."""
        code = self.proc.returncode if self.proc is not None else None
        if code is not None and self.launcher == "bwrap" and 128 < code < 128 + 65:
            status = self.worker_status()
            if status is not None:
                return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            return 128 - code
        return code

    def worker_status(self) -> int | None:
        """The worker's own wait status under bubblewrap, from its pidfd once it has ended (None before, or
        where the kernel keeps none)."""
        if self.status is None and self.pidfd is not None:
            self.status = reaped_status(self.pidfd)
        return self.status

    async def printed(self) -> str:
        """What the process wrote to its stderr so far, up to 4000 bytes, waiting at most 2 s ("" when it has
        none: the sandbox worker moves its own stderr away at once, so this is bubblewrap's or a server's)."""
        if self.launcher != "bwrap" or self.proc is None or self.proc.stderr is None:
            return ""
        try:
            text = await asyncio.wait_for(self.proc.stderr.read(4000), 2)
        except (TimeoutError, ValueError):
            return ""
        return text.decode(errors="replace").strip()

    def ended(self) -> tuple[str | None, str]:
        """``killed`` when the process died of a SIGKILL that neither this worker (a timeout, a reset, close)
        nor the sandbox's code and limits can have sent: the host's OOM killer, an operator, a node shutting
        down. Only bubblewrap's root shows that:

        - bubblewrap's own process, SIGKILLed: the sandbox cannot see it (it is outside its process namespace);
        - the worker, SIGKILLed by its exact wait status (``worker_status``): it is PID 1 of its namespace,
          where the kernel drops the SIGKILL its own code or children send it, and an ``os._exit(137)`` reads
          as an exit; unless its CPU time may have reached its hard limit (the one SIGKILL the kernel sends
          for the sandbox's own doing: code that ignores the SIGXCPU a second before).

        Anything else is the sandbox's own death, which the model reads: an unconfined worker (no process
        namespace: its code could SIGKILL itself), or a kernel before 6.15 (no exact status for the worker).
        """
        if self.killed_by_us or self.launcher != "bwrap" or self.proc is None:
            return None, ""
        if self.proc.returncode == -signal.SIGKILL:
            return "killed", "its bubblewrap process was killed from outside (SIGKILL)"
        status = self.worker_status()
        if status is None or not os.WIFSIGNALED(status) or os.WTERMSIG(status) != signal.SIGKILL:
            return None, ""
        if self.cpu_limit_in_reach():
            return None, "killed by SIGKILL: its CPU time may have reached its limit"
        return "killed", "its process was killed from outside (SIGKILL)"

    def cpu_limit_in_reach(self) -> bool:
        """Whether the worker's CPU time may have reached its CPU limit by now: what it had used when the last
        request was sent, plus every core busy since (an upper bound; True when nothing is known)."""
        limit = self.limits.cpu_seconds if self.harden else None
        if limit is None:
            return False
        if self.cpu_mark is None:
            return True
        used, since = self.cpu_mark
        return used + (time.monotonic() - since) * (os.cpu_count() or 1) >= limit

    async def start(self) -> None:
        if self.workdir is None:
            self.folder = make_sandbox_folder()
            self.workdir = str(self.folder / "work")
        # The child dies with this process (PR_SET_PDEATHSIG, see _worker.die_with_parent). The kernel sends
        # that signal when the *thread* that forked the child ends, here the thread of the running event loop;
        # a sandbox is bound to that loop (its pipes are), so it could not be used after the thread ends anyway.
        config: dict[str, Any] = {"workdir": self.workdir, "parent_pid": os.getpid()}
        argv = list(self.argv)
        confined = False
        if self.harden:
            iso = self.isolation_config
            view = sandbox_view(iso, self.workdir, [str(WORKER)] if WORKER_ARG in argv else [])
            config.update(
                limits={k: v for k, v in asdict(self.limits).items() if v is not None},
                network=iso.network,
                filesystem=iso.filesystem,
                own_uid=iso.own_uid,
                read_paths=[p for p, mode in view.items() if mode == "ro"],
            )
            if iso.filesystem == "restricted" and not inside_sandbox():
                if iso.own_uid and os.geteuid() == 0:
                    refuse_unreadable(view)
                # The sandbox's interpreter is PID 1 of a process namespace (``_worker.become_pid_1``): as root,
                # of one it makes below bubblewrap's; otherwise bubblewrap's own, where it keeps bubblewrap's
                # uid, so the parent-death signal bubblewrap sends it is allowed.
                interpreter = WORKER_ARG in argv
                root = os.geteuid() == 0
                argv = [*bwrap_argv(view, self.workdir, iso.network, as_pid_1=interpreter and not root), *argv]
                if interpreter:
                    config["pid_namespace"] = "own" if root else "bubblewrap"
                # Landlock may list the folders bubblewrap made to hold ``read_paths`` (a plugin folder with only
                # the entries this sandbox may see, for the import system): in its root they hold nothing else.
                made = set(_layout(view)[0])
                config["list_paths"] = sorted({os.path.dirname(os.path.abspath(p)) for p in iso.read_paths} & made)
                # Its parent is bubblewrap (which dies with us), and its private uid is told on stdin once the
                # launcher's pid, which names it, is known (its own pid is 1 in its process namespace).
                config.update(parent_pid=None, launcher="bwrap")
                confined = True
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": self.workdir,
            "TMPDIR": self.workdir,
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "AGENTFLY_SANDBOX": json.dumps(config),
            **self.extra_env,
        }
        self.proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            # bubblewrap's own errors (no namespaces) come here; the worker moves fd 2 to a memfd at once.
            stderr=asyncio.subprocess.PIPE if confined else asyncio.subprocess.DEVNULL,
            cwd=self.workdir,
            env=env,
            start_new_session=True,  # its own process group: killpg takes its children too
            limit=STREAM_LIMIT,
        )
        self.pid = self.proc.pid
        self.launcher = "bwrap" if confined else None
        _live_workers.add(self)
        self._record_pid()
        try:
            if confined:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"uid": 100000 + self.pid}).encode() + b"\n")
                await self.proc.stdin.drain()
            hello = await asyncio.wait_for(self._read(), self.ready_timeout)
        except (ResourceError, ConnectionResetError, BrokenPipeError) as exc:
            reason = await self.printed()
            await self.kill_async()
            if reason.startswith("bwrap:"):
                raise SandboxUnavailable(NO_BWRAP.format(reason=f"it failed ({reason})")) from exc
            if reason:
                raise ResourceError(f"{exc}: {reason[-1000:]}") from exc
            raise
        except BaseException:
            await self.kill_async()
            raise
        if not hello.get("ready"):
            await self.kill_async()
            raise ResourceError(f"sandbox process did not start: {hello.get('error', hello)}")
        if confined:
            self.worker_pid = host_pid(self.pid, hello.get("pids") or [int(hello.get("pid", 0))])
            if self.worker_pid is not None:
                with contextlib.suppress(OSError):
                    self.pidfd = os.pidfd_open(self.worker_pid)
        self.report = hello.get("isolation", {})
        user = str(self.report.get("user", ""))
        # Only a uid the sandbox moved to is its own ("uid N" alone); "uid N (not root ...)" is the one it was
        # started with (a job's team uid, inside a job's sandbox), whose other processes are not ours to kill.
        if re.fullmatch(r"uid \d+", user) and int(user.split()[1]) >= 100000:
            self.uid = int(user.split()[1])
            self._record_pid()

    def _record_pid(self) -> None:
        """Tell a later sweep which process (and private uid) this sandbox is, outside its writable work/."""
        if self.folder is None or self.pid is None:
            return
        record = {"pid": self.pid, "start": start_time(self.pid) or 0, "uid": self.uid}
        tmp = self.folder / "pid.tmp"
        tmp.write_text(json.dumps(record))
        tmp.replace(self.folder / "pid")

    async def _read(self) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        line = await self.proc.stdout.readline()
        if not line:
            await self.proc.wait()
            raise ResourceError(f"sandbox process exited ({describe_exit(self.exit_code())})")
        try:
            message: dict[str, Any] = json.loads(line)
            return message
        except ValueError:
            # Code in the sandbox wrote into the protocol channel: nothing it says can be trusted any more.
            await self.kill_async()
            raise ResourceError("the sandbox wrote garbage into its control channel and was stopped") from None

    async def request(self, message: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """Send one request and wait for its reply; on timeout the process is killed and TimeoutError raised."""
        async with self.lock:
            if not self.alive:
                raise ResourceError("sandbox process is not running")
            assert self.proc is not None and self.proc.stdin is not None
            if self.worker_pid is not None:
                used = cpu_seconds(self.worker_pid)
                self.cpu_mark = None if used is None else (used, time.monotonic())
            try:
                self.proc.stdin.write(json.dumps(message).encode() + b"\n")
                await self.proc.stdin.drain()
                return await asyncio.wait_for(self._read(), timeout)
            except (TimeoutError, asyncio.CancelledError):
                # The reply may still come and would answer the wrong request: the process must go.
                await self.kill_async()
                raise
            except (BrokenPipeError, ConnectionResetError) as exc:
                await self.proc.wait()
                raise ResourceError(f"sandbox process exited ({describe_exit(self.exit_code())})") from exc

    def kill(self) -> None:
        """Kill the process group, the worker's process tree and every process of the private uid; remove the
        working directory."""
        _live_workers.discard(self)
        self.killed_by_us = True
        if self.pidfd is not None:
            self.worker_status()  # kept for ``exit_code`` if it has ended already
            os.close(self.pidfd)
            self.pidfd = None
        if self.pid is not None:
            strays = descendants(self.pid)  # before the worker dies and its tree is handed to init
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
            for pid in strays:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        if self.uid is not None:
            kill_uid(self.uid)
        transport = getattr(self.proc, "_transport", None)
        loop = getattr(transport, "_loop", None)
        if loop is not None and loop.is_closed():
            # Killed after its event loop ended (engine.close() after asyncio.run): closing the transport
            # would schedule a callback on the dead loop and raise when it is garbage-collected.
            transport._closed = True  # type: ignore[union-attr]
        if self.folder is not None:
            with contextlib.suppress(OSError):
                remove_tree(self.folder)
        elif self.own_workdir and self.workdir and os.path.isdir(self.workdir):
            shutil.rmtree(self.workdir, ignore_errors=True)

    async def kill_async(self) -> None:
        self.kill()
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.proc.wait(), 5)
        if self.proc is not None and self.proc.stdin is not None:
            with contextlib.suppress(Exception):
                self.proc.stdin.close()

    async def close(self) -> None:
        """Ask nicely (close stdin), then kill whatever is left."""
        if self.proc is not None and self.proc.returncode is None and self.proc.stdin is not None:
            with contextlib.suppress(Exception):
                self.proc.stdin.close()
                await asyncio.wait_for(self.proc.wait(), 2)
        await self.kill_async()

    def kill_strays(self) -> int:
        """Kill every process the sandbox left running; returns how many.

        The worker is a child subreaper, so its descendants are exactly its process tree: a few reads of
        /proc/<pid>/task/*/children instead of a scan of every process on the machine.
        """
        if self.pid is None:
            return 0
        total = 0
        root = self.worker_pid or self.pid  # below bubblewrap: the worker's tree, never the worker itself
        for _ in range(20):  # a fork bomb keeps forking while we kill: repeat until the tree is empty
            found = descendants(root)
            for pid in found:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            total += len(found)
            if not found:
                break
        return total


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (zombies excluded), from the kernel's per-task children lists."""
    found: list[int] = []
    stack = [pid]
    while stack:
        current = stack.pop()
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{current}/task/{tid}/children") as f:
                    children = [int(c) for c in f.read().split()]
            except OSError:
                continue
            for child in children:
                try:
                    if _real_uid(child) is None:  # a zombie: dead already
                        continue
                except OSError:
                    continue
                found.append(child)
                stack.append(child)
    return found


def host_pid(root: int, inner: int | Sequence[int]) -> int | None:
    """The host's pid of the descendant of ``root`` whose pid in its own process namespace is ``inner`` (or
    whose pids in the innermost namespaces are the list ``inner``, outermost first: bubblewrap's init and a
    worker below it are each PID 1 of a namespace)."""
    tail = [str(p) for p in ([inner] if isinstance(inner, int) else inner)]
    for pid in descendants(root):
        try:
            with open(f"/proc/{pid}/status") as f:
                ids = next((line.split()[1:] for line in f if line.startswith("NSpid:")), [])
        except OSError:
            continue
        if ids[-len(tail):] == tail:
            return pid
    return None


def kill_uid(uid: int, keep: int | None = None) -> int:
    """SIGKILL every process owned by ``uid`` except ``keep``. Loops because a fork bomb keeps forking."""
    total = 0
    for _ in range(20):
        killed = 0
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == keep:
                continue
            try:
                if _real_uid(int(entry)) != uid:
                    continue
                os.kill(int(entry), signal.SIGKILL)
                killed += 1
            except (OSError, ProcessLookupError):
                continue
        total += killed
        if not killed:
            break
    return total


def _real_uid(pid: int) -> int | None:
    # Not os.stat(/proc/pid).st_uid: a process that changed uid is "non-dumpable" and its /proc entry
    # shows root as the owner.
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("State:") and line.split()[1] in ("Z", "X"):
                return None  # a zombie: already dead, waits for its parent to reap it
            if line.startswith("Uid:"):
                return int(line.split()[1])
    return None


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = {
            "SIGXCPU": ": CPU time limit reached",
            "SIGKILL": ": killed (timeout, memory, or CPU limit)",
            "SIGSEGV": ": segmentation fault",
        }.get(name, "")
        return f"killed by {name}{hint}"
    return f"exit code {code}"
