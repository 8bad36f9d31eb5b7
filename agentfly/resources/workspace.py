"""``Workspace``: a coding agent's repository in a sandbox, one per rollout, and forkable.

    ws = Workspace()
    await ws.start()
    await ws.prepare({"calc.py": "...", "tests/test_calc.py": "..."})   # files, then git init + commit
    await ws.sh("cd tests && ls")          # Shell(text='test_calc.py', exit_code=0); the directory is kept
    await ws.sh("pwd")                     # '/workspace/tests'
    kids = await ws.fork(8)                # 8 copy-on-write copies of this state, in milliseconds
    await ws.close()

Every command is one bubblewrap root of its own (``local.sandbox_view``: the Python installation and system
programs read-only, no host socket, no network, rlimits, a private uid, Landlock), with the workspace at
``/workspace`` and a private ``/tmp``; a command's processes die with it (its own process namespace), so
nothing runs between calls and nothing is left behind. What persists is files and the shell's working
directory, which the workspace keeps.

Forks. The workspace's files are an overlay: read-only layers shared by a lineage of forks, and an upper
folder of the instance's own writes. ``fork(n)`` freezes the upper into a new shared layer and gives the
parent and each copy a fresh, empty upper on the same layers: no file is copied, and a write in one copy
(a copy-up into its own upper) is never seen by the others. The overlay is mounted by the command's launcher
in a mount namespace of its own (root only; bubblewrap below 0.9 has no overlay option), so a mount lives
exactly as long as its command. Where that is impossible (not root, no overlayfs) the workspace is one folder
and a fork copies it (``cp --reflink=auto``: block-sharing where the filesystem allows).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import secrets
import shutil
import signal
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

from agentfly.resources.backends.docker import blocking
from agentfly.resources.backends.local import (
    WORKER,
    Isolation,
    Limits,
    SandboxUnavailable,
    bwrap_argv,
    descendants,
    inside_sandbox,
    kill_uid,
    make_sandbox_folder,
    remove_tree,
    sandbox_view,
)
from agentfly.resources.spec import InfrastructureFailure, ResourceError

SHELL = WORKER.with_name("_shell.py")
MOUNT_POINT = "/workspace"  # where the repository is, inside every command's root
MAX_LAYERS = 40  # overlayfs takes the lower folders in one mount option of at most a page
DEFAULT_TEST_COMMAND = "python -m pytest -q -p no:cacheprovider"
# Only overlayfs's own metadata: every file and folder the sandbox writes is its own (see _shell.py's umask).
MOUNT_SH = 'mount -t overlay overlay -o "$1" "$2" || exit 125; shift 2; exec "$@"'
# Programs a coding agent expects beside the Python installation: git's helpers and templates.
EXTRA_READ = ("/usr/share/git-core", "/usr/libexec/git-core", "/etc/alternatives")


@dataclass(frozen=True)
class Shell:
    """One command's outcome: its output (stdout and stderr interleaved, head and tail kept when long), the
    exit code (None when it timed out and was killed) and where the shell stood after it."""

    text: str
    exit_code: int | None
    cwd: str
    timed_out: bool = False
    truncated: int = 0  # output bytes left out of the middle

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def observation(self) -> str:
        """The text a model reads: the output, then how the command ended when it did not succeed."""
        text = self.text.rstrip("\n")
        if self.timed_out:
            text += "\n[killed: the command ran past its time limit]"
        elif self.exit_code:
            text += f"\n[exit code {self.exit_code}]"
        return text or "(no output)"


def command_env(cwd: str, path: str) -> dict[str, str]:
    """The environment of a workspace's command on every backend: nothing of the host's but a ``PATH``."""
    return {
        "PATH": path,
        "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8", "TERM": "dumb", "PAGER": "cat", "GIT_PAGER": "cat",
        "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
        # A project's tests run with pytest alone, not with the plugins installed beside it.
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "GIT_AUTHOR_NAME": "agent", "GIT_AUTHOR_EMAIL": "agent@workspace", "GIT_COMMITTER_NAME": "agent",
        "GIT_COMMITTER_EMAIL": "agent@workspace",
        # Each command runs under a uid of its own, and the repository's owner is another one.
        "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*",
        "AF_CWD": cwd,
    }


@cache
def overlay_available() -> str | None:
    """None when a workspace can be an overlay (forks share files), else why it is a plain folder."""
    if os.geteuid() != 0:
        return "not root: the overlay is mounted in a mount namespace of the command's own, which needs root"
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return "util-linux's unshare and mount are not on PATH"
    try:
        with open("/proc/filesystems") as f:
            if not any(line.split()[-1:] == ["overlay"] for line in f):
                return "the kernel has no overlayfs (modprobe overlay)"
    except OSError:
        return "no /proc/filesystems"
    return None


class _Lineage:
    """The folder a workspace and all its forks share: an empty ``base``, the frozen layers (``l<k>``), and
    each instance's upper and overlay work folders; a layer is removed when no instance stands on it, and the
    folder when the last instance closes. Under ``sandbox_root()`` with its owner's pid in its name, so a sweep
    removes it when the owner died without closing."""

    def __init__(self) -> None:
        self.folder = make_sandbox_folder()
        # The sandbox reaches its files through the bind mount alone; the host folders stay root's.
        self.folder.chmod(0o700)
        (self.folder / "base").mkdir(mode=0o755)
        self.refs: dict[str, int] = {}
        self.members = 0
        self._ids = itertools.count(1)

    def new_dir(self, prefix: str, mode: int = 0o755) -> Path:
        path = self.folder / f"{prefix}{next(self._ids)}"
        path.mkdir(mode=mode)
        return path

    def hold(self, layers: list[str]) -> None:
        for layer in layers:
            self.refs[layer] = self.refs.get(layer, 0) + 1

    def drop(self, layers: list[str]) -> None:
        for layer in layers:
            self.refs[layer] -= 1
            if self.refs[layer] == 0:
                del self.refs[layer]
                remove_tree(Path(layer))

    def leave(self) -> None:
        self.members -= 1
        if self.members == 0:
            with contextlib.suppress(OSError):
                remove_tree(self.folder)


class _Bounded:
    """A command's output: the first and last ``limit // 2`` bytes, and how many were left out between."""

    def __init__(self, limit: int) -> None:
        self.half = max(1, limit // 2)
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        if len(self.tail) > self.half:
            self.dropped += len(self.tail) - self.half
            del self.tail[: len(self.tail) - self.half]

    def bytes(self) -> bytes:
        if not self.dropped:
            return bytes(self.head + self.tail)
        return bytes(self.head) + f"\n... [{self.dropped} bytes of output left out] ...\n".encode() + bytes(self.tail)


RESOURCE = "workspace"  # the name its tools (agentfly.tools.builtin.workspace) and the repair reward ask for


class Workspace:
    """A repository in a sandbox, for one rollout at a time. Options (also from ``ResourceSpec.options``):

    Args:
        spec: the ResourceSpec when built by a pool (its ``options`` are read).
        limits: ``Limits`` of each command (CPU seconds, address space, files, processes).
        isolation: ``Isolation`` of each command; the filesystem must be "restricted" (a bubblewrap root).
        timeout: a command's default time limit in seconds.
        max_output: bytes of a command's output returned (head and tail kept).
        test_command: what ``run_tests`` runs (a task's sample may name its own).
        files: {relative path: text} prepared at start and after each reset (a fixed repository).
        tmp_bytes: the size of each command's private ``/tmp``.
        overlay: False to use copied folders even where overlays work (the benchmark's baseline, tests).
        backend: "docker" for a container per workspace (``DockerWorkspace``: its ``image`` and ``engines``);
            else (the spec's backend when omitted) a bubblewrap root per command on this host.
    """

    kind = "sandbox"
    # Rollouts of one group get forks of one prepared instance (``ResourceEngine.fork_group``).
    group_forks = True

    def __new__(cls, spec: Any = None, **kwargs: Any) -> Workspace:
        # One class to name in a spec: backend="docker" (the spec's or the keyword) makes it a container's.
        if cls is Workspace and (kwargs.get("backend") or getattr(spec, "backend", None)) == "docker":
            cls = DockerWorkspace
        return super().__new__(cls)

    def __init__(
        self,
        spec: Any = None,
        *,
        backend: str | None = None,
        limits: Limits | None = None,
        isolation: Isolation | None = None,
        timeout: float = 30.0,
        max_output: int = 16_000,
        test_command: str = DEFAULT_TEST_COMMAND,
        files: Mapping[str, str | bytes] | None = None,
        tmp_bytes: int = 64 << 20,
        overlay: bool | None = None,
    ) -> None:
        options = dict(getattr(spec, "options", None) or {})
        self.limits: Limits = limits or options.get("limits") or Limits(cpu_seconds=120, processes=64)
        self.isolation_config: Isolation = isolation or options.get("isolation") or Isolation()
        self.timeout = float(options.get("timeout", timeout))
        self.max_output = int(options.get("max_output", max_output))
        self.test_command = str(options.get("test_command", test_command))
        self._spec_test_command = self.test_command  # what a reset goes back to (a sample may name its own)
        self.files: Mapping[str, str | bytes] = files if files is not None else options.get("files") or {}
        self.tmp_bytes = int(options.get("tmp_bytes", tmp_bytes))
        use_overlay = options.get("overlay", overlay)
        self.overlay = overlay_available() is None if use_overlay is None else bool(use_overlay)
        if self.overlay and overlay_available() is not None:
            raise SandboxUnavailable(f"Workspace(overlay=True): {overlay_available()}; leave overlay unset")
        self.cwd = MOUNT_POINT
        self.prepared: str | None = None  # the key of what ``prepare`` loaded (a task sample's id)
        self.report: dict[str, Any] = {}
        self.commands = 0
        self.usage: dict[str, int] = {}  # what the tools did (edits, test runs...), for the reward's report
        self._lineage: _Lineage | None = None
        self._layers: list[str] = []  # shared, read-only, lowest first
        self._upper: Path | None = None  # this instance's writes (overlay), or its whole tree (copy)
        self._work: Path | None = None
        self._mount: Path | None = None
        self._lock = asyncio.Lock()
        self._running: asyncio.subprocess.Process | None = None
        self._running_uid: int | None = None
        self.closed = False

    # ------------------------------------------------------------------ lifecycle (the Resource protocol)
    async def start(self) -> None:
        if self.isolation_config.filesystem != "restricted":
            raise SandboxUnavailable("a Workspace runs every command in a bubblewrap root (it mounts the repository "
                                     "at /workspace); use Isolation(filesystem='restricted')")
        self._lineage = _Lineage()
        self._lineage.members += 1
        self._new_upper()
        if self.files:
            await self.prepare(self.files)

    def _new_upper(self) -> None:
        assert self._lineage is not None
        self._upper = self._lineage.new_dir("u", 0o777)
        if self.overlay:
            self._work = self._lineage.new_dir("w", 0o700)
            self._mount = self._lineage.new_dir("m", 0o700)

    def _drop_upper(self) -> None:
        for path in (self._upper, self._work, self._mount):
            if path is not None and path.exists():
                remove_tree(path)
        self._upper = self._work = self._mount = None

    async def reset(self) -> None:
        """Back to an empty workspace (or the ``files`` it starts with) for the next rollout."""
        async with self._lock:
            self._check()
            assert self._lineage is not None
            self._drop_upper()
            self._lineage.drop(self._layers)
            self._layers = []
            self._new_upper()
            self.cwd = MOUNT_POINT
            self.prepared = None
            self.test_command = self._spec_test_command
            self.usage = {}
        if self.files:
            await self.prepare(self.files)

    async def health(self) -> bool:
        return not self.closed and self._upper is not None and self._upper.is_dir()

    async def close(self) -> None:
        if self.closed:
            return
        self._kill_running()
        async with self._lock:
            self._release()

    def kill(self) -> None:
        self._kill_running()
        self._release()

    def _release(self) -> None:
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(OSError):
            self._drop_upper()
        if self._lineage is not None:
            with contextlib.suppress(OSError, KeyError):
                self._lineage.drop(self._layers)
            self._layers = []
            self._lineage.leave()

    def _started(self) -> bool:
        return self._lineage is not None

    def _check(self) -> None:
        if self.closed or not self._started():
            raise ResourceError("this Workspace is closed or was never started; acquire one from a ResourceEngine "
                                "or await start()")

    def isolation(self) -> dict[str, Any]:
        """What took effect (for the pool's stats): the isolation of the last command, and how forks work."""
        return {**self.report, "forks": "overlay" if self.overlay else f"copy ({overlay_available()})"}

    # ------------------------------------------------------------------ forking
    async def fork(self, n: int) -> list[Workspace]:
        """``n`` copies of this workspace as it stands (files, the repository, the working directory), each
        writing only its own files. Waits for a running command to end first."""
        if n < 0:
            raise ValueError(f"fork(n={n}): n must be >= 0")
        async with self._lock:
            self._check()
            return await self._fork(n)

    async def _fork(self, n: int) -> list[Workspace]:
        if not self.overlay:
            return [await self._copy() for _ in range(n)]
        self._freeze()
        return [self._child() for _ in range(n)]

    def _freeze(self) -> None:
        """Make this instance's writes a shared read-only layer, and give it a fresh upper on top."""
        assert self._lineage is not None and self._upper is not None
        if not any(self._upper.iterdir()):
            return  # nothing written since the last freeze: the layers already are this state
        if len(self._layers) >= MAX_LAYERS:
            raise ResourceError(f"this workspace was forked {MAX_LAYERS} times after writes; overlayfs takes no more "
                                "layers. Fork from an earlier copy, or prepare a fresh workspace")
        layer = self._lineage.folder / f"l{next(self._lineage._ids)}"
        self._upper.rename(layer)
        self._layers.append(str(layer))
        self._lineage.hold([str(layer)])
        self._drop_upper()
        self._new_upper()

    def _settings(self) -> dict[str, Any]:
        """The keywords that make another workspace like this one (a fork's)."""
        return {"limits": self.limits, "isolation": self.isolation_config, "timeout": self.timeout,
                "max_output": self.max_output, "test_command": self.test_command, "files": self.files,
                "tmp_bytes": self.tmp_bytes, "overlay": self.overlay}

    def _sibling(self) -> Workspace:
        kid = type(self)(**self._settings())
        kid.cwd, kid.prepared, kid.report, kid.usage = self.cwd, self.prepared, dict(self.report), dict(self.usage)
        kid.test_command, kid._spec_test_command = self.test_command, self._spec_test_command
        return kid

    def _child(self) -> Workspace:
        assert self._lineage is not None
        kid = self._sibling()
        kid._lineage = self._lineage
        self._lineage.members += 1
        kid._layers = list(self._layers)
        self._lineage.hold(kid._layers)
        kid._new_upper()
        return kid

    async def _copy(self) -> Workspace:
        """A fork without overlays: a copy of the tree, sharing blocks where the filesystem can."""
        assert self._upper is not None
        kid = self._sibling()
        kid._lineage = _Lineage()
        kid._lineage.members += 1
        kid._upper = kid._lineage.folder / "u1"
        proc = await asyncio.create_subprocess_exec("cp", "-a", "--reflink=auto", str(self._upper), str(kid._upper),
                                                    stderr=asyncio.subprocess.PIPE)
        _, err = await proc.communicate()
        if proc.returncode != 0:
            kid.kill()
            raise ResourceError(f"could not copy the workspace: {err.decode(errors='replace')[-300:]}")
        return kid

    # ------------------------------------------------------------------ the repository
    async def prepare(self, files: Mapping[str, str | bytes], *, key: str | None = None, git: bool = True) -> None:
        """Load ``files`` into this (empty) workspace and, with ``git``, make them a repository's first commit.
        With ``key`` (a task sample's id) a second call for the same key does nothing: a fork of a prepared
        workspace is prepared already."""
        if key is not None and self.prepared == key:
            return
        async with self._lock:
            self._check()
            if self.prepared is not None or self._holds_files():
                raise ResourceError(f"this workspace already holds files ({self.prepared or 'written by commands'}); "
                                    "prepare a task only in a fresh or reset workspace")
            for rel in files:
                parts = Path(rel).parts
                if os.path.isabs(rel) or ".." in parts or not parts:
                    raise ValueError(f"workspace file {rel!r}: give a relative path inside the repository")
            await self._load(files)
        if git:
            done = await self.sh("git init -q && git add -A && git commit -qm 'the task as given'", timeout=60)
            if not done.ok:
                raise ResourceError(f"could not make the workspace a git repository: {done.observation()[-500:]}")
        self.prepared = key if key is not None else ""

    def _holds_files(self) -> bool:
        assert self._upper is not None
        return bool(self._layers) or any(self._upper.iterdir())

    async def _load(self, files: Mapping[str, str | bytes]) -> None:
        """Write ``files`` (checked relative paths) into the empty workspace, from the host, into a folder no
        sandbox has seen yet."""
        assert self._upper is not None
        for rel, content in files.items():
            path = self._upper.joinpath(*Path(rel).parts)
            for parent in reversed(path.relative_to(self._upper).parents[:-1]):
                folder = self._upper / parent
                folder.mkdir(exist_ok=True)
                folder.chmod(0o777)
            path.write_bytes(content.encode() if isinstance(content, str) else content)
            path.chmod(0o666)

    async def prepare_sample(self, sample: Mapping[str, Any]) -> None:
        """Prepare this workspace for a task sample: its ``files`` (a repository), once per sample id; and its
        ``test_command`` when it names one. A sample without files leaves the workspace as it is."""
        files = sample.get("files")
        if sample.get("test_command"):
            self.test_command = str(sample["test_command"])
        if isinstance(files, Mapping) and files:
            await self.prepare(files, key=str(sample.get("id", "")))

    async def tally(self, what: str | None = None) -> dict[str, int]:
        """Count one thing a tool did (``edits``, ``test_runs``...) for the reward's report; returns the counts so
        far. A method, so that a rollout's tools count the same on a handle of an instance on Ray."""
        if what is not None:
            self.usage[what] = self.usage.get(what, 0) + 1
        return dict(self.usage)

    async def sh(self, command: str, timeout: float | None = None) -> Shell:
        """Run ``command`` with bash in the workspace's current directory; the directory it ends in is kept."""
        mark = f"\x1eAF-CWD-{secrets.token_hex(8)}:"
        raw, code, timed_out, dropped = await self._run("bash", [], b"", timeout, {"AF_CMD": command, "AF_MARK": mark})
        text = raw.decode(errors="replace")
        head, found, cwd = text.rpartition(mark)
        if found:
            text = head[:-1] if head.endswith("\n") else head
            if cwd.startswith("/") and "\n" not in cwd:
                self.cwd = cwd
        return Shell(text, None if timed_out else code, self.cwd, timed_out, dropped)

    async def read_file(self, path: str, limit: int = 64_000) -> str:
        """The text of ``path`` (relative to the working directory), at most ``limit`` bytes of it."""
        raw, code, timed_out, _ = await self._run("read", [path], b"", 30, {"AF_LIMIT": str(limit)}, merge=False)
        if code != 0 or timed_out:
            raise FileNotFoundError(f"cannot read {path!r}: {raw.decode(errors='replace').strip()[-300:]}")
        body, _, meta = raw.rpartition(b"\n")
        size = int(json.loads(meta)["size"])
        text = body.decode(errors="replace")
        return text if size <= limit else text + f"\n... [{size - limit} more bytes not shown]"

    async def write_file(self, path: str, content: str | bytes) -> None:
        """Write ``content`` to ``path`` (relative to the working directory), making its folders."""
        data = content.encode() if isinstance(content, str) else content
        raw, code, timed_out, _ = await self._run("write", [path], data, 30, {}, merge=False)
        if code != 0 or timed_out:
            raise OSError(f"cannot write {path!r}: {raw.decode(errors='replace').strip()[-300:]}")

    async def apply_patch(self, patch: str) -> Shell:
        """Apply a unified diff (``git apply``, paths relative to the repository's top) and say what it did."""
        raw, code, timed_out, dropped = await self._run(
            "bash", [], patch.encode(), 30,
            {"AF_CMD": "git apply --recount --whitespace=nowarn -v - 2>&1", "AF_MARK": "\x1eAF-NOCWD:"})
        text = raw.decode(errors="replace").rpartition("\x1eAF-NOCWD:")[0]
        return Shell(text, None if timed_out else code, self.cwd, timed_out, dropped)

    async def run_tests(self, command: str | None = None, timeout: float | None = None) -> Shell:
        """Run the project's tests from the repository's top (``test_command`` unless one is given)."""
        saved = self.cwd
        self.cwd = MOUNT_POINT
        try:
            return await self.sh(command or self.test_command, timeout)
        finally:
            self.cwd = saved

    async def diff(self) -> str:
        """The agent's changes against the task as given: ``git diff`` of the working tree, new files included."""
        saved = self.cwd
        self.cwd = MOUNT_POINT
        try:
            shown = await self.sh("git add -A -N . && git -c core.quotepath=off --no-pager diff --no-color HEAD")
        finally:
            self.cwd = saved
        return shown.text

    # ------------------------------------------------------------------ running one command
    def _argv(self, mode: str, args: list[str]) -> list[str]:
        assert self._upper is not None
        iso = self.isolation_config
        tree = self._mount if self.overlay else self._upper
        assert tree is not None
        extra = tuple(p for p in EXTRA_READ if os.path.exists(p))
        view = sandbox_view(Isolation(iso.network, iso.filesystem, iso.own_uid, (*iso.read_paths, *extra)),
                            str(tree), [str(WORKER), str(SHELL)])
        view.pop(os.path.abspath(tree))
        # In a job's sandbox (a web-launched job) its commands get a bubblewrap root of their own too, without a
        # /proc: the kernel refuses a second procfs there. git, pytest and the shell's programs need none.
        argv = bwrap_argv(view, MOUNT_POINT, iso.network, proc=not inside_sandbox())
        # Before the final "--": the repository, and a /tmp of the command's own (git, pytest and pip write there).
        argv[-1:-1] = ["--bind", str(tree), MOUNT_POINT,
                       "--perms", "1777", "--size", str(self.tmp_bytes), "--tmpfs", "/tmp"]
        argv += [sys.executable, "-I", str(SHELL), mode, *args]
        if self.overlay:
            assert self._work is not None
            lower = ":".join([*reversed(self._layers), str(self._lineage.folder / "base")])  # type: ignore[union-attr]
            options = f"lowerdir={lower},upperdir={self._upper},workdir={self._work}"
            argv = ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", MOUNT_SH, "sh",
                    options, str(self._mount), *argv]
        config = {
            "workdir": MOUNT_POINT, "write_paths": ["/tmp"], "launcher": "bwrap",
            "limits": {k: v for k, v in asdict(self.limits).items() if v is not None},
            "network": iso.network, "filesystem": iso.filesystem, "own_uid": iso.own_uid,
            "read_paths": [p for p, m in view.items() if m == "ro"],
        }
        self._config = json.dumps(config)
        return argv

    def _env(self, extra: dict[str, str]) -> dict[str, str]:
        return {**command_env(self.cwd, f"{sys.prefix}/bin:/usr/local/bin:/usr/bin:/bin"),
                "AGENTFLY_SANDBOX": self._config, **extra}

    async def _run(self, mode: str, args: list[str], stdin: bytes, timeout: float | None, env: dict[str, str],
                   merge: bool = True) -> tuple[bytes, int | None, bool, int]:
        """Run one launcher; (its output, exit code, whether it timed out, output bytes left out)."""
        timeout = self.timeout if timeout is None else float(timeout)
        async with self._lock:
            self._check()
            argv = self._argv(mode, args)
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT if merge else asyncio.subprocess.PIPE,
                env=self._env(env), start_new_session=True)
            # The private uid is named after the launcher's host pid, as for every local sandbox.
            self._running, self._running_uid = proc, 100000 + proc.pid
            self.commands += 1
            out = _Bounded(self.max_output)
            err = _Bounded(4000)

            async def pump(stream: asyncio.StreamReader | None, into: _Bounded) -> None:
                while stream is not None and (chunk := await stream.read(65536)):
                    into.add(chunk)

            async def feed() -> None:
                assert proc.stdin is not None
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    proc.stdin.write(json.dumps({"uid": 100000 + proc.pid}).encode() + b"\n" + stdin)
                    await proc.stdin.drain()
                    proc.stdin.close()

            timed_out = False
            try:
                await asyncio.wait_for(asyncio.gather(feed(), pump(proc.stdout, out), pump(proc.stderr, err),
                                                      proc.wait()), timeout)
            except TimeoutError:
                timed_out = True
            finally:
                if proc.returncode is None:
                    self._kill_running()
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(proc.wait(), 5)
                self._running = self._running_uid = None
        code = proc.returncode
        if code == 125 and self.overlay:
            raise InfrastructureFailure(f"the workspace's overlay could not be mounted: {out.bytes().decode()[-300:]}",
                                        "unhealthy")
        said = out.bytes() if merge else err.bytes()
        if code == 126 and b"agentfly: isolation failed" in said:
            raise InfrastructureFailure(said.decode(errors="replace")[-300:], "unhealthy")
        if not merge and code != 0:
            return said, code, timed_out, 0
        return out.bytes(), code, timed_out, out.dropped

    def _kill_running(self) -> None:
        proc, uid = self._running, self._running_uid
        if proc is None or proc.returncode is not None:
            return
        strays = descendants(proc.pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in strays:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if uid is not None and os.geteuid() == 0:
            kill_uid(uid)

    @property
    def folder(self) -> Path | None:
        """The host folder of this workspace's lineage (for tests and sweeps)."""
        return self._lineage.folder if self._lineage is not None else None

    async def __aenter__(self) -> Workspace:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# ---------------------------------------------------------------------------------- the docker backend
DEFAULT_WORKSPACE_IMAGE = os.environ.get("AGENTFLY_WORKSPACE_IMAGE", "agentfly-workspace:local")
# One command in the container, run by bash as nobody: the per-process limits, then the command or a file
# operation; on exit the working directory (after the mark) and every process the command left is killed
# (``kill -1`` spares the shell itself and the container's PID 1).
_DOCKER_PROLOGUE = (
    'ulimit $AF_ULIMIT 2>/dev/null\n'
    'cd -- "$AF_CWD" 2>/dev/null || cd /workspace\n'
)
_DOCKER_MODES = {
    "bash": _DOCKER_PROLOGUE + 'trap \'printf "\\n%s%s" "$AF_MARK" "$PWD"; kill -9 -1 2>/dev/null\' EXIT\n'
                               'eval "$AF_CMD"\n',
    "write": _DOCKER_PROLOGUE + 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"\n',
    "read": _DOCKER_PROLOGUE + 'head -c "$AF_LIMIT" -- "$1" || exit 1\n'
                               'printf \'\\n{"size": %s}\' "$(stat -L -c %s -- "$1")"\n',
}


class _Images:
    """The fork images a docker workspace and its forks share: removed when the last of them closes."""

    def __init__(self) -> None:
        self.images: list[str] = []
        self.members = 0
        self.client: Any = None

    def leave(self) -> None:
        from agentfly.resources.backends.docker import ExecContainer

        self.members -= 1
        if self.members == 0 and self.images and self.client is not None:
            ExecContainer.remove_images(self.client, self.images)
            self.images = []


class DockerWorkspace(Workspace):
    """The workspace on the docker backend (``Workspace(backend="docker")``, or a spec with ``backend="docker"``):
    one container per workspace, from an image with bash, git, Python and pytest (``image``, default
    ``$AGENTFLY_WORKSPACE_IMAGE`` or ``agentfly-workspace:local``; ``deploy/workspace.Dockerfile`` builds it).

    The container runs as nobody with no network, no capabilities, ``no-new-privileges``, cgroup limits on
    memory, CPU and processes (``limits``, ``cpus``) and a tmpfs ``/tmp``; each command is a ``docker exec``
    with the per-process limits on top, and what it leaves running is killed when it ends. The repository is
    ``/workspace`` in the container's own files, so a fork is ``docker commit`` and one container per copy
    from that image: the engine's copy-on-write layers, shared by the copies. Containers may run on another
    host's engine (``engines``, as for ``PythonSandbox``); a fork runs on its parent's. A container that is
    removed, killed from outside or whose engine stops answering is an ``InfrastructureFailure``.
    """

    def __init__(self, spec: Any = None, *, image: str | None = None, engines: Any = None, cpus: float = 1.0,
                 **kwargs: Any) -> None:
        kwargs["overlay"] = False
        super().__init__(spec, **kwargs)
        options = dict(getattr(spec, "options", None) or {})
        self.image = str(image or options.get("image") or DEFAULT_WORKSPACE_IMAGE)
        self.cpus = float(options.get("cpus", cpus))
        spec_options = getattr(spec, "options", None)
        # The spec's own dict, not a copy: the docker engines' counts are shared by the whole pool.
        self.docker_options: dict[str, Any] = (
            {"engines": engines} if engines is not None
            else spec_options if isinstance(spec_options, dict) else options)
        self._box: Any = None
        self._family: _Images | None = None
        self._depth = 0  # fork images below this one's container
        self._dirty = False  # a command ran: the workspace may hold files
        self._lost = False  # its container stopped by the code's own doing

    def _new_box(self, image: str | None = None) -> Any:
        from agentfly.resources.backends.docker import ExecContainer, engines_of

        return ExecContainer(image or self.image, limits=self.limits, cpus=self.cpus, tmp_bytes=self.tmp_bytes,
                             engines=engines_of(self.docker_options))

    async def _open(self, box: Any, on: int | None = None) -> None:
        """Start ``box`` and make its ``/workspace`` nobody's (any image with bash, git and Python serves)."""
        def create() -> None:
            box.create(on)
            if on is None:
                box.put_archive("/", _tar({"workspace/": None}))
        try:
            await blocking(create)
        except BaseException:
            await blocking(box.remove)
            raise

    async def _fresh(self) -> None:
        """A new container of the image, with a lineage of its own, in place of the one this workspace had. The
        new one is this workspace's before it starts, so a ``kill`` meanwhile removes it (its start then refuses)."""
        old, family = self._box, self._family
        self._box, self._family = self._new_box(), _Images()
        self._family.members += 1
        await blocking(self._drop, old, family)
        await self._open(self._box)
        self._family.client = self._box.client

    async def start(self) -> None:
        await self._fresh()
        if self.files:
            await self.prepare(self.files)

    async def reset(self) -> None:
        async with self._lock:
            self._check()
            await self._fresh()
            self.cwd, self.prepared, self.usage, self._depth, self._dirty, self._lost = MOUNT_POINT, None, {}, 0, False, False
            self.test_command = self._spec_test_command
        if self.files:
            await self.prepare(self.files)

    @staticmethod
    def _drop(box: Any, family: _Images | None) -> None:
        if box is not None:
            box.remove()
        if family is not None:
            family.leave()

    async def health(self) -> bool:
        return (not self.closed and not self._lost and self._box is not None
                and await blocking(self._box.alive))

    async def close(self) -> None:
        if not self.closed:
            await blocking(self.kill)

    def kill(self) -> None:
        if self.closed:
            return
        self.closed = True
        box, family, self._box, self._family = self._box, self._family, None, None
        self._drop(box, family)

    def _kill_running(self) -> None:
        if self._box is not None:
            self._box.kill_commands()

    def _started(self) -> bool:
        return self._box is not None

    def isolation(self) -> dict[str, Any]:
        box = self._box
        return {"network": "none (container)", "user": "65534 (nobody)", "capabilities": "none",
                "image": self.image, "engine": box.engine_name if box is not None else None,
                "forks": "docker commit (the engine's copy-on-write layers)"}

    def _settings(self) -> dict[str, Any]:
        return {**super()._settings(), "image": self.image, "cpus": self.cpus,
                "engines": self.docker_options.get("engines")}

    async def _fork(self, n: int) -> list[Workspace]:
        if self._depth >= MAX_LAYERS:
            raise ResourceError(f"this workspace was forked {MAX_LAYERS} times deep; the image's layers take no "
                                "more. Fork from an earlier copy, or prepare a fresh workspace")
        assert self._family is not None
        image = await blocking(self._box.commit)
        self._family.images.append(image)
        kids: list[DockerWorkspace] = []
        for _ in range(n):
            kid = self._sibling()
            assert isinstance(kid, DockerWorkspace)
            kid._family, kid._depth, kid._dirty = self._family, self._depth + 1, True
            self._family.members += 1
            kid._box = kid._new_box(image)
            kids.append(kid)
        opened = await asyncio.gather(*(k._open(k._box, on=self._box.engine_index) for k in kids),
                                      return_exceptions=True)
        failed = next((r for r in opened if isinstance(r, BaseException)), None)
        if failed is not None:
            for kid in kids:
                await blocking(kid.kill)
            raise failed
        return list(kids)

    def _holds_files(self) -> bool:
        return self._dirty or self._depth > 0

    async def _load(self, files: Mapping[str, str | bytes]) -> None:
        tree: dict[str, bytes | None] = {}
        for rel, content in files.items():
            parts = Path(rel).parts
            for k in range(1, len(parts)):
                tree["workspace/" + "/".join(parts[:k]) + "/"] = None
            tree["workspace/" + "/".join(parts)] = content.encode() if isinstance(content, str) else content
        await blocking(self._box.put_archive, "/", _tar(tree))

    async def _run(self, mode: str, args: list[str], stdin: bytes, timeout: float | None, env: dict[str, str],
                   merge: bool = True) -> tuple[bytes, int | None, bool, int]:
        from agentfly.resources.backends.docker import ContainerGone

        timeout = self.timeout if timeout is None else float(timeout)
        out, err = _Bounded(self.max_output), _Bounded(4000)
        async with self._lock:
            self._check()
            box = self._box
            argv = ["bash", "--noprofile", "--norc", "-c", _DOCKER_MODES[mode], "bash", *args]
            full_env = {**command_env(self.cwd, "/usr/local/bin:/usr/bin:/bin"), "AF_ULIMIT": box.ulimits(), **env}
            self.commands += 1
            self._dirty = True
            call = asyncio.ensure_future(blocking(box.run, argv, stdin, full_env, timeout, out,
                                                           None if merge else err))
            try:
                code, timed_out = await asyncio.shield(call)
            except ContainerGone as gone:
                kind, why = gone.args
                if kind is not None:
                    raise InfrastructureFailure(f"the workspace's container stopped: {why}", kind) from None
                self._lost = True  # the code's own doing: the model reads it, and the pool replaces the container
                return f"[the workspace's container stopped: {why}]".encode(), 137, False, 0
            except asyncio.CancelledError:
                await blocking(box.kill_commands)  # the thread's command ends, and with it the thread
                with contextlib.suppress(BaseException):
                    await call
                raise
        said = out.bytes() if merge else err.bytes()
        if not merge and code != 0:
            return said, code, timed_out, 0
        return out.bytes(), code, timed_out, out.dropped


def _tar(tree: Mapping[str, bytes | None]) -> bytes:
    """A tar of ``tree`` (a name ending in "/" is a folder, else a file's bytes), every entry nobody's."""
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in tree.items():
            info = tarfile.TarInfo(name.rstrip("/"))
            info.uid = info.gid = 65534
            info.uname = info.gname = "nobody"
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
