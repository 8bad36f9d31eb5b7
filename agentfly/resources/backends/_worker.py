"""The process on the other side of a sandbox: a persistent Python interpreter behind a JSON-lines protocol.

This file is run as a script (``python _worker.py``) by the local backend and inside a container by the
docker backend, so it imports nothing but the standard library. Other workers (ScienceWorld) reuse its
``serve`` loop and ``harden`` step by importing it.

Protocol: one JSON object per line on the *original* stdin/stdout, which the worker moves to private file
descriptors before anything else runs; fd 0 becomes /dev/null and fds 1/2 become in-memory capture files,
so user code that prints or reads stdin can never corrupt the protocol.

Under the local backend the worker starts inside bubblewrap, in a root that holds only what
``local.sandbox_view`` lists (no host socket, no other sandbox's folder) and a network namespace of its own.
Hardening (``harden``), applied by the worker to itself before it reads its first request, in this order
because each step needs the privileges the next one drops:
1. resource limits (CPU seconds, address space, open files, file size, processes);
2. a new network namespace (``unshare(CLONE_NEWNET)``): only a down loopback, so no connection leaves;
3. when running as root, a private uid (100000 + pid) so the process limit counts this sandbox only and
   the parent can find and kill every process the sandbox spawned, even those that left its group;
4. Landlock: reads only below the Python installation, the system libraries and the working directory,
   writes only in the working directory.
Each step reports whether it took effect; the parent shows that in the pool stats.
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import io
import json
import os
import resource
import shutil
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any

CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
SYS_LANDLOCK_CREATE_RULESET = 444  # the same number on every architecture (new syscall table)
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
# Landlock filesystem rights, by ABI version (linux/landlock.h).
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_ALL_V1 = (1 << 13) - 1
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
READ_ONLY = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
# This file's name in tracebacks; "<string>" when the docker backend runs it with ``python -c``.
_SELF = globals().get("__file__", "<string>")


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _errno_text() -> str:
    return os.strerror(ctypes.get_errno())


def die_with_parent(parent_pid: int | None) -> None:
    """Be SIGKILLed by the kernel when the parent dies (Linux), however it dies, so no sandbox outlives the
    worker that owns it. Called first thing: if the parent died before the call, we were already handed to
    another parent and ``getppid()`` says so. (SIGKILL, not a signal we could handle: user code could
    replace a handler.)"""
    if parent_pid is None or not sys.platform.startswith("linux"):
        return
    _libc().prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


def apply_limits(limits: dict[str, Any]) -> dict[str, str]:
    """Set the rlimits named in ``limits``; return what was set, by name."""
    applied = {}
    table = {
        "cpu_seconds": resource.RLIMIT_CPU,
        "memory_bytes": resource.RLIMIT_AS,
        "open_files": resource.RLIMIT_NOFILE,
        "file_size_bytes": resource.RLIMIT_FSIZE,
        "processes": resource.RLIMIT_NPROC,
    }
    for key, which in table.items():
        value = limits.get(key)
        if value is None:
            continue
        try:
            # The CPU limit's hard bound sits a second above the soft one, so a process that spends its CPU
            # time dies of SIGXCPU, and a SIGKILL always comes from outside (see LocalWorker.killed_from_outside).
            hard = int(value) + 1 if which == resource.RLIMIT_CPU else int(value)
            resource.setrlimit(which, (int(value), hard))
            applied[key] = str(value)
        except (ValueError, OSError) as exc:
            applied[key] = f"not set: {exc}"
    # A write past RLIMIT_FSIZE should fail with an error the user sees, not kill the interpreter.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    return applied


def isolate_network() -> str:
    """Move into a fresh network namespace; return 'namespace' or why it was not possible."""
    libc = _libc()
    if libc.unshare(CLONE_NEWNET) == 0:
        return "namespace"
    first = _errno_text()
    # Unprivileged users may still create a user namespace and a network namespace inside it.
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWNET | 0x10000000) == 0:  # CLONE_NEWUSER
        try:
            with open("/proc/self/setgroups", "w") as f:
                f.write("deny")
            with open("/proc/self/uid_map", "w") as f:
                f.write(f"{uid} {uid} 1")
            with open("/proc/self/gid_map", "w") as f:
                f.write(f"{gid} {gid} 1")
        except OSError:
            pass
        return "namespace (user namespace)"
    return f"unavailable: unshare(CLONE_NEWNET) failed ({first}); the sandbox can reach the network"


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32))


def _others_can_reach(path: str) -> bool:
    """Can a uid other than the owner traverse every directory down to ``path``?"""
    current = os.path.realpath(path)
    while True:
        try:
            if not os.stat(current).st_mode & 0o001:
                return False
        except OSError:
            return False
        parent = os.path.dirname(current)
        if parent == current:
            return True
        current = parent


def _uid_mapped(uid: int) -> bool:
    """Whether ``uid`` exists in this process's user namespace (``/proc/self/uid_map``: inside, outside, count)."""
    try:
        with open("/proc/self/uid_map") as f:
            ranges = [tuple(int(n) for n in line.split()) for line in f if line.strip()]
    except OSError:
        return True
    return any(inside <= uid < inside + count for inside, _outside, count in ranges)


def drop_privileges(workdir: str, uid: int | None = None, read_paths: Sequence[str] = ()) -> str:
    """As root, become a uid of our own so RLIMIT_NPROC counts only this sandbox's processes.

    When the interpreter, or a path the sandbox is given to read (a server's script), lives where other users
    cannot reach it (e.g. under /root, or a 0700 temporary folder), the new uid keeps one capability,
    CAP_DAC_READ_SEARCH, to go on reading them; Landlock still confines what it may read.
    """
    if os.geteuid() != 0:
        return f"uid {os.getuid()} (not root: the process limit is shared with that user's processes)"
    uid = uid or 100000 + os.getpid()
    if not _uid_mapped(uid):
        # Root of a user namespace that maps no other uid (a sandbox started inside a job's sandbox): there is
        # no uid to move to, and chown/setuid to one fails with EINVAL.
        return (f"uid {os.getuid()} of a user namespace that maps no uid of its own "
                "(the process limit is shared with the enclosing sandbox's processes)")
    keep_read = not all(_others_can_reach(p) for p in (os.path.join(sys.base_prefix, "lib"), sys.prefix, *read_paths))
    libc = _libc()
    if keep_read:
        libc.prctl(8, 1, 0, 0, 0)  # PR_SET_KEEPCAPS: keep the permitted set across setuid
    os.chown(workdir, uid, uid)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if not keep_read:
        return f"uid {uid}"
    cap = 1 << 2  # CAP_DAC_READ_SEARCH
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (_CapData * 2)(_CapData(cap, cap, 0), _CapData(0, 0, 0))
    if libc.capset(ctypes.byref(header), data) != 0:
        return f"uid {uid} (capset failed: {_errno_text()}; imports outside the standard library may fail)"
    return f"uid {uid} (+CAP_DAC_READ_SEARCH: the Python installation or a readable path is not reachable by other users)"


def landlock(read_paths: list[str], write_paths: list[str], list_paths: list[str] | None = None) -> str:
    """Restrict the filesystem to ``read_paths`` (read/execute) and ``write_paths`` (everything); the folders
    ``list_paths`` may be listed, not read."""
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), LANDLOCK_CREATE_RULESET_VERSION)
    if abi < 1:
        return f"unavailable: Landlock is not enabled in this kernel ({_errno_text()}); files outside the sandbox are readable"
    handled = FS_ALL_V1
    if abi >= 2:
        handled |= FS_REFER
    if abi >= 3:
        handled |= FS_TRUNCATE
    if abi >= 5:
        handled |= FS_IOCTL_DEV
    attr = ctypes.c_uint64(handled)
    fd = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(8), 0)
    if fd < 0:
        return f"unavailable: landlock_create_ruleset failed ({_errno_text()})"
    try:
        rules = [(p, FS_READ_DIR) for p in list_paths or []] + [(p, READ_ONLY) for p in read_paths]
        for path, rights in rules + [(p, handled) for p in write_paths]:
            try:
                pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # a path that does not exist here needs no rule
            try:
                if not os.path.isdir(path):
                    # Directory-only rights are refused on files.
                    rights &= FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
                rule = _PathBeneath(rights & handled, pfd)
                if libc.syscall(SYS_LANDLOCK_ADD_RULE, fd, LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
                    return f"unavailable: landlock_add_rule({path}) failed ({_errno_text()})"
            finally:
                os.close(pfd)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return f"unavailable: prctl(NO_NEW_PRIVS) failed ({_errno_text()})"
        if libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, fd, 0) != 0:
            return f"unavailable: landlock_restrict_self failed ({_errno_text()})"
    finally:
        os.close(fd)
    return f"landlock (ABI {abi})"


def harden(config: dict[str, Any]) -> dict[str, Any]:
    """Apply the isolation ``config`` asks for (see the module docstring); return what took effect."""
    report: dict[str, Any] = {}
    workdir = config.get("workdir") or os.getcwd()
    # A child subreaper adopts orphaned descendants, so everything the sandbox starts (even after a double
    # fork or setsid) stays in this process's tree, where the parent finds it cheaply on reset.
    _libc().prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    report["limits"] = apply_limits(config.get("limits") or {})
    bwrap = config.get("launcher") == "bwrap"
    if config.get("network") == "none":
        report["network"] = "namespace (bubblewrap)" if bwrap else isolate_network()
    else:
        report["network"] = "allowed"
    if config.get("own_uid"):
        report["user"] = drop_privileges(workdir, config.get("uid"), list(config.get("read_paths") or []))
        # The kernel clears the parent-death signal when the credentials change: ask for it again.
        die_with_parent(config.get("parent_pid"))
    if config.get("filesystem") == "restricted":
        report["filesystem"] = landlock(list(config.get("read_paths") or []), [workdir, *config.get("write_paths", [])],
                                        list(config.get("list_paths") or []))
        if bwrap:
            report["filesystem"] += " in a bubblewrap root (local.sandbox_view)"
    else:
        report["filesystem"] = "unrestricted"
    return report


def receive_identity(channel: Channel, config: dict[str, Any]) -> None:
    """Under bubblewrap: take the private uid the parent names on the first line (its own pid is 2 in its
    process namespace, so it cannot name one itself), and die with bubblewrap's process from now on."""
    if config.get("launcher") != "bwrap":
        return
    config["parent_pid"] = os.getppid()
    die_with_parent(config["parent_pid"])
    identity = channel.read() or {}
    uid = identity.get("uid")
    if isinstance(uid, int) and uid >= 100000:
        config["uid"] = uid


class Channel:
    """The protocol pipes, moved off fds 0/1/2 so user code cannot touch them by accident."""

    def __init__(self) -> None:
        self.inp = os.fdopen(os.dup(0), "rb", buffering=0)
        self.out = os.fdopen(os.dup(1), "wb", buffering=0)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        self.stdout = Capture(1)
        self.stderr = Capture(2)
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True, errors="replace")
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True, errors="replace")
        self._buffer = b""

    def read(self) -> dict[str, Any] | None:
        while b"\n" not in self._buffer:
            chunk = self.inp.read(1 << 16)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        message: dict[str, Any] = json.loads(line)
        return message

    def write(self, message: dict[str, Any]) -> None:
        data = json.dumps(message, ensure_ascii=False).encode() + b"\n"
        while data:
            data = data[self.out.write(data) :]


class Capture:
    """An in-memory file (memfd) behind fd ``target``: it never fills a pipe, and it has no path."""

    def __init__(self, target: int) -> None:
        fd = os.memfd_create(f"capture{target}")
        os.dup2(fd, target)
        os.close(fd)
        self.fd = target

    def take(self, limit: int) -> tuple[str, int]:
        """Return (the first ``limit`` characters, how many more there were) and empty the file."""
        size = os.fstat(self.fd).st_size
        os.lseek(self.fd, 0, os.SEEK_SET)
        data = os.read(self.fd, min(size, limit * 4 + 4)) if size else b""
        os.ftruncate(self.fd, 0)
        os.lseek(self.fd, 0, os.SEEK_SET)
        text = data.decode("utf-8", errors="replace")
        extra = max(0, size - len(data))
        if len(text) > limit:
            extra += len(text[limit:].encode())
            text = text[:limit]
        return text, extra


def run_code(code: str, namespace: dict[str, Any]) -> str | None:
    """Execute ``code`` like a notebook cell: the value of a final expression is shown. Returns an error name."""
    try:
        tree = ast.parse(code, "<sandbox>", "exec")
        final = tree.body[-1] if tree.body else None
        last = final if isinstance(final, ast.Expr) else None
        if last is not None:
            tree.body.pop()
        exec(compile(tree, "<sandbox>", "exec"), namespace)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), "<sandbox>", "eval"), namespace)
            if value is not None:
                print(repr(value))
        return None
    except BaseException as exc:  # SystemExit, KeyboardInterrupt and MemoryError are the user's errors too
        tb = exc.__traceback__
        # Hide this file's frames: the user only needs to see their own code.
        while tb is not None and tb.tb_frame.f_code.co_filename == _SELF:
            tb = tb.tb_next
        sys.stderr.write("".join(traceback.format_exception(type(exc), exc, tb)))
        return type(exc).__name__
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def _clear_dir(path: str) -> None:
    for entry in os.scandir(path):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)


def python_handlers(workdir: str, channel: Channel) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
    """The requests a Python sandbox answers: exec, reset, ping."""
    state: dict[str, Any] = {"ns": {"__name__": "__main__"}}
    base_env = dict(os.environ)

    def do_exec(req: dict[str, Any]) -> dict[str, Any]:
        error = run_code(req["code"], state["ns"])
        limit = int(req.get("max_output", 10_000))
        out, out_more = channel.stdout.take(limit)
        err, err_more = channel.stderr.take(limit)
        return {"ok": True, "stdout": out, "stdout_truncated": out_more, "stderr": err,
                "stderr_truncated": err_more, "error": error}

    def do_reset(req: dict[str, Any]) -> dict[str, Any]:
        # Reap the children the parent killed (kill_strays) so they do not linger as zombies.
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        state["ns"] = {"__name__": "__main__"}
        os.chdir(workdir)
        _clear_dir(workdir)
        os.environ.clear()
        os.environ.update(base_env)
        channel.stdout.take(0)
        channel.stderr.take(0)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {"ok": True, "threads": threading.active_count(),
                "cpu_seconds": usage.ru_utime + usage.ru_stime}

    def do_ping(req: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "pid": os.getpid()}

    return {"exec": do_exec, "reset": do_reset, "ping": do_ping}


def serve(channel: Channel, handlers: dict[str, Callable[[dict[str, Any]], dict[str, Any]]]) -> None:
    """Answer requests until stdin closes. A handler's exception becomes an error reply, not a crash."""
    while True:
        request = channel.read()
        if request is None:
            return
        handler = handlers.get(request.get("op", ""))
        try:
            if handler is None:
                reply = {"ok": False, "error": f"unknown op {request.get('op')!r}; known: {sorted(handlers)}"}
            else:
                reply = handler(request)
        except Exception as exc:
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        channel.write(reply)


def main() -> None:
    config = json.loads(os.environ.pop("AGENTFLY_SANDBOX", "{}"))
    die_with_parent(config.get("parent_pid"))
    channel = Channel()
    workdir = config.get("workdir") or os.getcwd()
    os.chdir(workdir)
    try:
        receive_identity(channel, config)
        report = harden(config)
    except Exception as exc:  # never run user code half-isolated: report and exit
        channel.write({"ok": False, "ready": False, "error": f"isolation failed: {type(exc).__name__}: {exc}"})
        return
    channel.write({"ok": True, "ready": True, "pid": os.getpid(), "isolation": report})
    serve(channel, python_handlers(workdir, channel))


if __name__ == "__main__":
    main()
