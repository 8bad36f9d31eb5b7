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
3. no capability: the bounding and ambient sets are emptied while CAP_SETPCAP is still held, then, when
   running as root, a private uid (100000 + pid) empties the permitted and effective sets (so the process
   limit counts this sandbox only, and the parent can find and kill every process the sandbox spawned, even
   those that left its group); ``drop_capabilities`` checks that nothing is left and sets no_new_privs. The
   runtime stays readable without CAP_DAC_READ_SEARCH because bubblewrap binds it at its own path below
   folders it makes traversable (a Python under a 0700 /root is fine); the parent refuses a path that other
   users cannot read (``local.refuse_unreadable``);
4. Landlock: reads only below the Python installation, the system libraries, the working directory and the
   sandbox's own /proc, writes only in the working directory and the POSIX devices (/dev/null, /dev/zero,
   /dev/full, /dev/random, /dev/urandom).
Each step reports whether it took effect; the parent shows that in the pool stats.

Before these, the worker becomes PID 1 of a process namespace (``become_pid_1``; bubblewrap's ``--as-pid-1``
when not root), where the kernel drops every signal the sandbox's code or children send it that it has no
handler for, SIGKILL included: code cannot make its own death look like a kill from outside.
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
import stat
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any

CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
INIT_NAME = b"sandbox-init"  # the process that waits above a sandbox's interpreter (``become_pid_1``)
PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_READ, PR_CAPBSET_DROP = 23, 24
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
CAP_SETPCAP = 8
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
# Devices any program may open for reading and writing (bubblewrap's --dev makes these and no others of the host).
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
PROC = ("/proc",)  # readable: /proc/self/status, /proc/cpuinfo (the sandbox's own process namespace under bwrap)
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
            # time dies of SIGXCPU; the hard bound's SIGKILL comes only to code that ignored that signal, and
            # LocalWorker.ended tells it from a SIGKILL from outside by the CPU time spent.
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


def others_can_read(path: str, ancestors: bool = True) -> bool:
    """Can a uid other than the owner read ``path`` (a folder: list and traverse it), and, with ``ancestors``,
    traverse every folder above it? Without ``ancestors`` only ``path`` itself counts: in a bubblewrap root the
    folders above a bound path are bubblewrap's own (0755), whatever the host's are (/root is 0700)."""
    current = os.path.realpath(path)
    try:
        mode = os.stat(current).st_mode
    except OSError:
        return False
    if not mode & 0o004 or (stat.S_ISDIR(mode) and not mode & 0o001):
        return False
    while ancestors:
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
        try:
            if not os.stat(current).st_mode & 0o001:
                return False
        except OSError:
            return False
    return True


def _uid_mapped(uid: int) -> bool:
    """Whether ``uid`` exists in this process's user namespace (``/proc/self/uid_map``: inside, outside, count)."""
    try:
        with open("/proc/self/uid_map") as f:
            ranges = [tuple(int(n) for n in line.split()) for line in f if line.strip()]
    except OSError:
        return True
    return any(inside <= uid < inside + count for inside, _outside, count in ranges)


def _capabilities() -> tuple[int, int, int]:
    """This process's (effective, permitted, bounding) capability sets as bit masks."""
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (_CapData * 2)()
    if _libc().capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), f"capget failed: {_errno_text()}")
    effective = data[0].effective | data[1].effective << 32
    permitted = data[0].permitted | data[1].permitted << 32
    bounding = 0
    for cap in range(64):
        if _libc().prctl(PR_CAPBSET_READ, cap, 0, 0, 0) == 1:
            bounding |= 1 << cap
    return effective, permitted, bounding


def drop_bounding_set() -> None:
    """Empty the bounding set and the ambient set, while we still hold CAP_SETPCAP (before the uid changes):
    afterwards no exec, not even of a setuid or file-capability binary, can give a capability back. A process
    without CAP_SETPCAP (not root) cannot empty it; ``no_new_privs`` (``drop_capabilities``) then keeps an exec
    from gaining anything."""
    libc = _libc()
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if not _capabilities()[0] & 1 << CAP_SETPCAP:
        return
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_READ, cap, 0, 0, 0) != 1:
            continue  # not held, or past the kernel's last capability
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"cannot drop capability {cap} from the bounding set: {_errno_text()}")


def drop_capabilities() -> str:
    """Leave the effective, permitted and inheritable sets empty (the bounding set went first, see
    ``drop_bounding_set``), and check that all three sets we can see are empty. Raises when one is not:
    untrusted code never runs with a capability."""
    libc = _libc()
    header = _CapHeader(0x20080522, 0)
    data = (_CapData * 2)(_CapData(0, 0, 0), _CapData(0, 0, 0))
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), f"capset failed: {_errno_text()}")
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl(NO_NEW_PRIVS) failed: {_errno_text()}")
    effective, permitted, bounding = _capabilities()
    if effective or permitted:
        raise OSError(f"capabilities left after dropping them: effective {effective:#x}, permitted {permitted:#x}")
    if bounding:
        return "none (effective and permitted sets empty; bounding set kept by a non-root parent, no_new_privs)"
    return "none (effective, permitted and bounding sets empty)"


def drop_privileges(workdir: str, uid: int | None = None, read_paths: Sequence[str] = (),
                    confined: bool = True) -> str:
    """As root, become a uid of our own, with no capability, so RLIMIT_NPROC counts only this sandbox's
    processes and no permission check is bypassed.

    The runtime stays readable without CAP_DAC_READ_SEARCH: in a bubblewrap root (``confined``) every path of
    ``read_paths`` is bound at its own place below folders bubblewrap makes traversable, so only the paths
    themselves must be readable by others, which the parent checked (``local.unreadable_paths``). Unconfined
    (trusted code, ``filesystem="host"``), a runtime that other users cannot reach keeps this process's uid,
    still without any capability.
    """
    if os.geteuid() != 0:
        return f"uid {os.getuid()} (not root: the process limit is shared with that user's processes)"
    uid = uid or 100000 + os.getpid()
    if not _uid_mapped(uid):
        # Root of a user namespace that maps no other uid (a sandbox started inside a job's sandbox): there is
        # no uid to move to, and chown/setuid to one fails with EINVAL.
        return (f"uid {os.getuid()} of a user namespace that maps no uid of its own "
                "(the process limit is shared with the enclosing sandbox's processes)")
    runtime = (os.path.join(sys.base_prefix, "lib"), sys.prefix, *read_paths)
    if not confined and not all(others_can_read(p) for p in runtime if os.path.exists(p)):
        return (f"uid {os.getuid()} (the Python installation or a read path is not readable by other users, "
                "so this unconfined sandbox keeps its uid, without capabilities)")
    os.chown(workdir, uid, uid)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # without PR_SET_KEEPCAPS this empties the permitted and effective sets
    return f"uid {uid}"


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
    # Capabilities go in every case (root or not, private uid or not): the bounding set first, while
    # CAP_SETPCAP is still held, then the uid change or capset empties the rest.
    drop_bounding_set()
    if config.get("own_uid"):
        report["user"] = drop_privileges(workdir, config.get("uid"), list(config.get("read_paths") or []),
                                         confined=bwrap)
        # The kernel clears the parent-death signal when the credentials change: ask for it again.
        die_with_parent(config.get("parent_pid"))
    report["capabilities"] = drop_capabilities()
    if config.get("filesystem") == "restricted":
        # The POSIX devices every program expects (a write to /dev/null, a read of /dev/urandom), and the
        # sandbox's own /proc (its own process namespace under bubblewrap), on top of what the view lists.
        report["filesystem"] = landlock([*(config.get("read_paths") or []), *PROC],
                                        [workdir, *config.get("write_paths", []), *DEVICES],
                                        list(config.get("list_paths") or []))
        if bwrap:
            report["filesystem"] += " in a bubblewrap root (local.sandbox_view)"
    else:
        report["filesystem"] = "unrestricted"
    return report


def receive_identity(channel: Channel, config: dict[str, Any]) -> None:
    """Under bubblewrap: take the private uid the parent names on the first line (its own pid is 1 in its
    process namespace, so it cannot name one itself), and die with bubblewrap's process from now on (its
    parent is outside the namespace, where ``getppid()`` reads 0)."""
    if config.get("launcher") != "bwrap":
        return
    config["parent_pid"] = os.getppid()
    die_with_parent(config["parent_pid"])
    identity = channel.read() or {}
    uid = identity.get("uid")
    if isinstance(uid, int) and uid >= 100000:
        config["uid"] = uid


def become_pid_1() -> None:
    """Go on as PID 1 of a process namespace of our own (under bubblewrap, as root, before the uid changes).

    There the kernel drops every signal the sandbox's code or its children send this process that it has no
    handler for, SIGKILL included, so code cannot make its own death look like a kill from outside
    (``LocalWorker.ended``). Bubblewrap's ``--as-pid-1`` does that without a fork, but then this process's
    parent is bubblewrap's outer process, which holds no capability: once this process is a private uid, the
    kernel refuses the parent-death signal bubblewrap sends it, and the sandbox outlived its owner. Here
    bubblewrap's init stays PID 1 of its namespace (root, and it dies with bubblewrap), and when it dies the
    kernel kills every process of that namespace, those of ours below it included.

    One fork: the child goes on; the parent (PID 2 of bubblewrap's namespace, which the sandbox's code can
    neither see nor signal) closes every descriptor, drops every capability and exits with the child's status.
    """
    if _libc().unshare(CLONE_NEWPID) != 0:
        raise OSError(ctypes.get_errno(), f"unshare(CLONE_NEWPID) failed: {_errno_text()}")
    child = os.fork()
    if child == 0:
        return
    os.closerange(0, os.sysconf("SC_OPEN_MAX"))  # the protocol pipes close when the child's copies do
    _libc().prctl(PR_SET_NAME, INIT_NAME, 0, 0, 0)  # what ps and the host's process lists show for it
    drop_bounding_set()
    drop_capabilities()
    while True:
        try:
            status = os.waitpid(child, 0)[1]
            break
        except InterruptedError:
            continue
    os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))


def namespace_pids() -> list[int]:
    """This process's pid in each process namespace from the one its /proc shows down to its own (NSpid), by
    which the parent finds it among its descendants (``local.host_pid``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("NSpid:"):
                return [int(n) for n in line.split()[1:]]
    return [os.getpid()]


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
        if config.get("pid_namespace") == "own":
            become_pid_1()
            config["parent_pid"] = None  # bubblewrap's init takes this namespace with it when it dies
        pids = namespace_pids()
        report = harden(config)
    except Exception as exc:  # never run user code half-isolated: report and exit
        channel.write({"ok": False, "ready": False, "error": f"isolation failed: {type(exc).__name__}: {exc}"})
        return
    if config.get("pid_namespace"):
        report["process"] = "PID 1 of its own process namespace (signals from inside it are dropped)"
    channel.write({"ok": True, "ready": True, "pid": os.getpid(), "pids": pids, "isolation": report})
    serve(channel, python_handlers(workdir, channel))


if __name__ == "__main__":
    main()
