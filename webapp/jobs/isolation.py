"""A job runs as its team: the training process in a bubblewrap sandbox, its events through the worker.

The Celery worker holds the server's secrets (``SECRET_KEY``, ``DATABASE_URL``, the Redis password); the
training process imports the team's own code (its reward, its tools), so it gets none of them. The worker
starts it (``python -m webapp.jobs.child``; every rank under ``torchrun`` runs inside it too) under
``bwrap`` with:

- **its team's uid and no capability** (a root worker: ``team_uid``, ``drop_to``; otherwise the worker's own
  uid in a user namespace, ``--cap-drop ALL``): empty effective, permitted and bounding sets;
- **an empty environment** but for the few variables listed here (``job_env``): no secret, no database or
  broker URL;
- **a root of its own, deny by default** (``sandbox_argv``): the system's ``/usr`` and a few files of
  ``/etc``, the Python installation and the project's code (``agentfly``, ``trainer``, ``webapp``) read-only;
  the shared plugin modules and the team's own plugin folder read-only (another team's folder is not there);
  the team's runs folder read-write; the model, data and checkpoint paths its config names (already checked
  by ``webapp.jobs.paths``) read-only; a private ``/tmp``, ``/dev`` and ``/proc`` (its own PID namespace: the
  worker and its ``/proc/<pid>/environ`` do not exist in there);
- **its own network namespace** (loopback only: the ranks of one host meet on it), unless the job needs other
  hosts (``AGENTFLY_JOB_NETWORK``; a multi-node job, pools on the Ray cluster, a rate-limited API): then the
  host's network, where PostgreSQL and Redis refuse it because it holds no password of theirs; a job with an
  API holds only its team's Redis user, which reaches its team's API budgets and nothing else
  (``webapp.jobs.apis``, docs/security.md).

The child writes one JSON line per message to a pipe the worker reads (``Pump``): the trainer's events, its
progress and checkpoints, and its outcome. The worker checks each one (the job id it was started for, a
known event type, a checkpoint inside the job's own folder) before it stores or announces anything. Cancel
and yielding are a ``STOP`` file the worker writes into the job's folder; the trainer checks it between steps
and ends with a checkpoint; a job that has not ended ``AGENTFLY_JOB_STOP_GRACE`` seconds later is stopped
(SIGTERM, then SIGKILL). The sandbox dies with the worker (``--die-with-parent``).

The job is hostile to the worker, too. The worker follows no path the job can write (``JobFolder``: the
folder and the worker's files in it by descriptor, ``O_NOFOLLOW``; the spec and ``/etc/hosts`` from in-memory
files); it fixes the job's mount plan once, from opened and checked descriptors (``config_mounts``,
``--ro-bind-fd``); and the job runs in a cgroup of its own with its team's limits (``job_limits``,
``agentfly.resources.backends.cgroups``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

from agentfly.resources.backends.cgroups import Cgroup, ResourceLimits, limit_argv, rlimits
from agentfly.resources.backends.local import SANDBOX_MARK
from webapp.jobs import paths
from webapp.jobs.body import CheckpointWatcher, Node, Outcome, TrackingError, die_with
from webapp.jobs.worker import clean_text
from webapp.registry.plugins import team_package

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
CODE = ("agentfly", "trainer", "webapp")  # the project's packages the training process imports
# The few files of /etc a Python process and its libraries read (the loader, users and names, TLS roots).
ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "hosts", "host.conf", "nsswitch.conf",
       "resolv.conf", "gai.conf", "passwd", "group", "localtime", "ssl", "ca-certificates", "ca-certificates.conf",
       "mime.types")
# One message line is at most this long (a step's sample trajectories are the biggest); longer is refused.
MAX_MESSAGE_BYTES = 32 << 20


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot create namespaces on this host."""


@dataclass
class Sandbox:
    """What one job's training process may see: folders read-write and read-only, and its network."""

    job_id: int
    team_slug: str
    output_dir: Path
    writable: list[Path] = field(default_factory=list)
    readable: list[Path] = field(default_factory=list)
    readable_fds: list[tuple[int, str]] = field(default_factory=list)  # ``config_mounts``: bound by descriptor
    network: str = "none"  # "none" (own loopback) or "host"
    env: dict[str, str] = field(default_factory=dict)
    uid: int | None = None  # the team's own uid (``team_uid``) when the worker is root; None: the worker's
    fds: list[int] = field(default_factory=list)  # descriptors bwrap reads (``--ro-bind-data``): pass, then close


# A root worker runs each team's jobs as a uid of the team's own (this base + the team's id), above every uid a
# local sandbox takes (100000 + a pid): no capability, no file of root's as its owner.
TEAM_UID_BASE = 10_000_000


def team_uid(team: Any) -> int | None:
    """The uid ``team``'s jobs run as when the worker is root (None otherwise: they run as the worker's user,
    in a user namespace of their own)."""
    return TEAM_UID_BASE + int(team.pk) if os.geteuid() == 0 else None


def enabled() -> bool:
    mode = settings.AGENTFLY_JOB_SANDBOX
    if mode not in ("bwrap", "off"):
        raise SandboxUnavailable(f"AGENTFLY_JOB_SANDBOX={mode!r} is not bwrap or off")
    return mode == "bwrap"


def network_for(config: dict[str, Any], nodes: int = 1) -> str:
    """``AGENTFLY_JOB_NETWORK``: none, host, or auto: the host's network only for a job that must reach other
    hosts (it spans several, its pools run on the operator's Ray cluster, or it calls a rate-limited API and
    shares its budget in Redis), its own loopback otherwise."""
    from webapp.jobs.apis import uses_api

    mode = settings.AGENTFLY_JOB_NETWORK
    if mode == "auto":
        return "host" if nodes > 1 or on_ray_cluster(config) or uses_api(config) else "none"
    if mode not in ("none", "host"):
        raise SandboxUnavailable(f"AGENTFLY_JOB_NETWORK={mode!r} is not auto, none or host")
    if mode == "none" and uses_api(config):
        raise SandboxUnavailable("the job calls a rate-limited API, which needs the host's network (the provider, "
                                 "and Redis for the team's budget), but AGENTFLY_JOB_NETWORK=none; the operator "
                                 "sets it to auto")
    return str(mode)


def plugin_mounts(team_slug: str) -> list[Path]:
    """The plugin files the job may read: every shared module and package of each plugin folder, and its
    own team's folder; never the folder itself, which holds every other team's folder too."""
    ident = team_package(team_slug).rpartition(".")[2]
    found: list[Path] = []
    for folder in map(Path, settings.AGENTFLY_PLUGIN_DIRS):
        if not folder.is_dir():
            continue
        for item in sorted(folder.iterdir()):
            if item.is_dir() and item.name.replace("-", "_") == ident:
                found.append(item)  # the team's own folder
            elif item.is_file() and item.suffix == ".py":
                found.append(item)  # a shared module
            elif item.is_dir() and (item / "__init__.py").is_file():
                found.append(item)  # a shared package
    return found


def config_mounts(config: dict[str, Any], team: Any, resume_from: str = "") -> list[tuple[int, str]]:
    """The mount plan of the paths the job's config (and the checkpoint it resumes from) reads outside its
    team's runs folder (a shared model or data set): ``(descriptor, where it appears)`` for each.

    Each path is resolved once, by opening it (``O_PATH``), and checked by what that descriptor points at
    (``/proc/self/fd/N``, with ``paths.refusal``: the team's folder or ``AGENTFLY_ALLOWED_PATHS``); bubblewrap
    then binds the descriptor (``--ro-bind-fd``), never the name again. A link the job flips in its own folder
    after the check changes nothing the sandbox sees; one flipped before it is refused (``PathRefused``).
    The caller owns the descriptors (``Sandbox.fds``)."""
    runs = Path(settings.AGENTFLY_RUNS_DIR).resolve()
    found: list[tuple[int, str]] = []
    try:
        for name, raw in paths.config_paths(config, resume_from):
            try:
                fd = os.open(raw, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # not there (yet): nothing to mount; the trainer says what is missing
            found.append((fd, ""))
            real = os.readlink(f"/proc/self/fd/{fd}")
            reason = paths.refusal(real, team)
            if reason:
                raise paths.PathRefused(f"{name}: {reason} (it is {real!r} now)", name)
            if Path(real).is_relative_to(runs):
                os.close(found.pop()[0])  # the team's own runs: mounted read-write already
                continue
            found[-1] = (fd, real)
    except BaseException:
        for fd, _ in found:
            os.close(fd)
        raise
    return found


def job_env(sandbox: Sandbox) -> dict[str, str]:
    """The training process's whole environment: what Python, torch and the trainer need, the variables the
    operator passes on by name (``AGENTFLY_JOB_ENV``), and nothing else."""
    venv_bin = str(Path(sys.executable).parent)
    env = {
        "PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin",
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(ROOT),
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "AGENTFLY_PLUGIN_DIRS": ",".join(str(Path(d).resolve()) for d in settings.AGENTFLY_PLUGIN_DIRS),
    }
    for name in settings.AGENTFLY_JOB_ENV:
        if name in os.environ and name not in env:
            env[name] = os.environ[name]
    env.update(sandbox.env)
    return env


def _bind(flag: str, path: Path) -> list[str]:
    return [flag, str(path), str(path)]


def _system_mounts() -> list[str]:
    """/usr and the top-level links or folders of the loader, read-only; a few files of /etc."""
    argv = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        p = Path(top)
        if p.is_symlink():
            argv += ["--symlink", os.readlink(p), top]
        elif p.is_dir():
            argv += _bind("--ro-bind", p)
    for name in ETC:
        p = Path("/etc") / name
        if p.exists():
            argv += _bind("--ro-bind", p)
    return argv


def _python_mounts() -> list[Path]:
    """The interpreter, its standard library and the virtual environment's packages."""
    # The venv also at the path it is named by, when that is a link (sys.executable is below it, and PATH).
    found = {Path(sys.prefix).resolve(), Path(sys.prefix).absolute(), Path(sys.base_prefix).resolve(),
             Path(sys.executable).resolve().parent}
    for p in sys.path:
        if p and ("site-packages" in p or "dist-packages" in p):
            found.add(Path(p).resolve())
    return [p for p in found if p.exists() and not p.is_relative_to("/usr")]


def _gpu_mounts() -> list[str]:
    argv: list[str] = []
    for dev in [*sorted(Path("/dev").glob("nvidia*")), Path("/dev/dri")]:
        if dev.exists():
            argv += _bind("--dev-bind", dev)
    if any(Path("/dev").glob("nvidia*")):
        argv += _bind("--ro-bind", Path("/sys"))  # the driver's and NVML's device tree
    return argv


def _with_parent_folders(mounts: Sequence[str]) -> list[str]:
    """``mounts`` (bwrap mount operations, in order) with ``--perms 0755 --dir F`` before each bind for every
    folder above its mount point that no earlier bind holds: bubblewrap makes missing ones 0700, which the
    team's uid could not traverse (a Python installation below /root, a runs folder below a 0700 temp folder).
    A folder is made again after a tmpfs is mounted above it (the tmpfs hides it)."""
    two = {"--ro-bind", "--ro-bind-try", "--bind", "--dev-bind", "--symlink", "--ro-bind-data", "--ro-bind-fd"}
    one = {"--proc", "--dev", "--tmpfs", "--perms"}
    out: list[str] = []
    bound: list[str] = []
    made: set[str] = set()
    i = 0
    while i < len(mounts):
        op = mounts[i]
        width = 3 if op in two else 2 if op in one else 1
        if op in two and op != "--symlink":
            point = mounts[i + 2]
            for parent in reversed(Path(point).parents):
                folder = str(parent)
                inside = any(folder == b or folder.startswith(b.rstrip("/") + "/") for b in bound)
                if folder != "/" and folder not in made and not inside:
                    out += ["--perms", "0755", "--dir", folder]
                    made.add(folder)
            bound.append(point)
        elif op == "--tmpfs":
            made = {f for f in made if not f.startswith(mounts[i + 1].rstrip("/") + "/")}
        out += mounts[i:i + width]
        i += width
    return out


def drop_to(uid: int) -> list[str]:
    """The command prefix, run by bubblewrap inside the sandbox, that becomes ``uid`` (gid too, no other
    group) with empty bounding, inheritable and ambient sets and no_new_privs, then execs the job: from
    there on it holds no capability at all."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise SandboxUnavailable("setpriv (util-linux) is not installed on this worker; a root worker needs it to "
                                 "run each job as its team's uid without capabilities (apt-get install util-linux)")
    return [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--bounding-set=-all",
            "--inh-caps=-all", "--ambient-caps=-all", "--no-new-privs", "--"]


def sandbox_argv(sandbox: Sandbox) -> list[str]:
    """The ``bwrap`` command line that runs a process as ``sandbox`` says (the command follows it)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable("bubblewrap (bwrap) is not installed on this worker; install it (apt-get install "
                                 "bubblewrap), or set AGENTFLY_JOB_SANDBOX=off to run jobs unisolated (not for "
                                 "several teams: docs/security.md)")
    argv = [bwrap, "--die-with-parent", "--new-session", "--clearenv"]
    if os.geteuid() == 0:
        # A root worker: bubblewrap makes the root (resolving each source as root, once), and the job runs as
        # its team's uid with no capability (``drop_to``). No user namespace: one mapped onto the host's root
        # would make the job the owner of every root file it sees (/proc/sys included).
        if sandbox.uid is None:
            raise SandboxUnavailable("a root worker runs a job only as its team's uid (Sandbox.uid, team_uid)")
        argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    else:
        # The worker's own uid, in a user namespace of its own, every capability dropped (bounding set too).
        argv += ["--unshare-all", "--cap-drop", "ALL"]
    mounts = _system_mounts()
    if sandbox.network == "host":
        argv.append("--share-net")
    else:
        argv.append("--unshare-net")
        # Its own loopback only: the ranks' rendezvous (torchrun) looks up the host name, which must resolve
        # there without DNS.
        # The file comes from an in-memory file the worker made (``--ro-bind-data``), never from a path in the
        # job's folder, where a job could have put a link for the worker to write through.
        name = f"job-{sandbox.job_id}"
        hosts = os.memfd_create("hosts", os.MFD_CLOEXEC)
        os.write(hosts, f"127.0.0.1 localhost {name}\n::1 localhost ip6-localhost ip6-loopback\n".encode())
        os.lseek(hosts, 0, os.SEEK_SET)
        sandbox.fds.append(hosts)
        argv += ["--hostname", name]
        # Readable by all: bubblewrap makes the file 0600 (root's) otherwise, and the job, its team's uid, could
        # not resolve even localhost (a torchrun rendezvous fails).
        mounts += ["--perms", "0444", "--ro-bind-data", str(hosts), "/etc/hosts"]
    mounts += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp", "--perms", "1777",
               "--tmpfs", "/dev/shm"]
    mounts += _gpu_mounts()
    for path in _python_mounts():
        mounts += _bind("--ro-bind", path)
    for name in CODE:
        mounts += _bind("--ro-bind", ROOT / name)
    for path in sandbox.readable:
        # "-try": a plugin folder listed when the job was planned may be gone when bubblewrap starts (a team
        # removing its folder); the job then runs without it (an import names what is missing), never fails to
        # start on a folder it was only allowed to read.
        mounts += _bind("--ro-bind-try", path)
    for fd, where in sandbox.readable_fds:
        mounts += ["--ro-bind-fd", str(fd), where]
    for path in sandbox.writable:
        mounts += _bind("--bind", path)
    argv += _with_parent_folders(mounts)
    for name, value in sorted(job_env(sandbox).items()):
        argv += ["--setenv", name, value]
    # Marked as one of our sandbox roots: a sandbox a job's tool starts (python_code) stays in this root and
    # confines itself further (limits, Landlock, a network namespace) instead of nesting bubblewrap, which
    # cannot mount a /proc of its own below this one.
    argv += ["--dir", SANDBOX_MARK, "--chdir", str(sandbox.output_dir), "--"]
    return argv + drop_to(sandbox.uid) if sandbox.uid is not None and os.geteuid() == 0 else argv


def hand_over(team_runs: Path, uid: int) -> None:
    """Give the team's runs folder to its uid, so its jobs write there without any capability. When the folder
    belonged to another uid (a team made again under the same slug, runs from before jobs ran as their team),
    everything in it is handed over too, without following a link (``lchown``)."""
    if os.lstat(team_runs).st_uid == uid:
        return
    for top, folders, files in os.walk(team_runs, followlinks=False):
        for name in [*folders, *files]:
            os.chown(os.path.join(top, name), uid, uid, follow_symlinks=False)
    os.chown(team_runs, uid, uid, follow_symlinks=False)


def sandbox_for(job: Any, output_dir: Path, config: dict[str, Any], env: dict[str, str] | None = None) -> Sandbox:
    """The sandbox of ``job``: its team's runs folder read-write, the code, shared plugins and the paths its
    config reads read-only; ``env`` besides (its team's Redis URL for its APIs)."""
    team_runs = paths.team_dir(job.team)
    team_runs.mkdir(parents=True, exist_ok=True)
    uid = team_uid(job.team)
    if uid is not None:
        hand_over(team_runs, uid)
        os.chown(output_dir, uid, uid, follow_symlinks=False)
    readable = plugin_mounts(job.team.slug)
    planned = config_mounts(config, job.team, job.resume_from)
    if config.get("mcp"):  # what its stdio servers may read (``mcpservers.rules.stdio_read_paths``)
        readable += [Path(p).resolve() for p in settings.AGENTFLY_MCP_READ_PATHS if Path(p).exists()]
    for name in ("HF_HOME", "HF_HUB_CACHE", "TRANSFORMERS_CACHE"):
        if os.environ.get(name) and Path(os.environ[name]).is_dir():
            readable.append(Path(os.environ[name]).resolve())  # downloaded models, shared read-only
    return Sandbox(job_id=job.pk, team_slug=job.team.slug, output_dir=output_dir.resolve(),
                   writable=[team_runs.resolve()], readable=readable, readable_fds=planned,
                   fds=[fd for fd, _ in planned], network=network_for(config, job.nodes),
                   env={**ray_env(config), **(env or {})}, uid=uid)


# A job whose pools run on the operator's Ray cluster joins it: with the cluster's token, when it has one.
RAY_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")


def on_ray_cluster(config: dict[str, Any]) -> bool:
    """Whether the job's pools run on the operator's Ray cluster (``webapp.jobs.cluster.with_ray`` said so)."""
    return bool((config.get("resource_backend") or {}).get("backend") == "ray")


def ray_env(config: dict[str, Any]) -> dict[str, str]:
    if not on_ray_cluster(config):
        return {}
    return {name: os.environ[name] for name in RAY_ENV if os.environ.get(name)}


def command(args: Sequence[str]) -> list[str]:
    """``python -m webapp.jobs.child ARGS``: the training process, as ``run_confined`` starts it."""
    return [sys.executable, "-P", "-m", "webapp.jobs.child", *args]


def confined(sandbox: Sandbox | None, program: Sequence[str], limits: ResourceLimits | None = None) -> list[str]:
    """``program`` inside ``sandbox`` (None: unisolated, AGENTFLY_JOB_SANDBOX=off), under the rlimits of
    ``limits`` set in there, by the sandbox's first process (``limit_argv``): in a non-root worker's user
    namespace the process limit then counts the job's processes alone (``agentfly.resources.backends.cgroups``)."""
    if sandbox is None:
        return list(program)
    return [*sandbox_argv(sandbox), *(limit_argv(limits) if limits is not None else []), *program]


def process_env(sandbox: Sandbox | None, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment ``bwrap`` itself starts with: the job's, never the worker's (bwrap's own process is
    PID 1 of the sandbox, and its ``/proc/1/environ`` is readable from inside). Unisolated, ``env`` is added
    to the worker's, less its secrets."""
    return job_env(sandbox) if sandbox is not None else {**unisolated_env(), **(env or {})}


def unisolated_env() -> dict[str, str]:
    """AGENTFLY_JOB_SANDBOX=off: the worker's environment, less what names a secret (still readable from
    the worker's files and /proc: the operator chose one trusted team)."""
    secret = ("SECRET_KEY", "DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND")
    env = {k: v for k, v in os.environ.items() if k not in secret and "PASSWORD" not in k}
    env["PYTHONPATH"] = str(ROOT)
    env["AGENTFLY_PLUGIN_DIRS"] = ",".join(str(Path(d).resolve()) for d in settings.AGENTFLY_PLUGIN_DIRS)
    return env


# ------------------------------------------------------------------------------------------- the worker's side
@dataclass
class Checked:
    """The checks the worker makes on each message of a job's training process."""

    job_id: int
    output_dir: Path
    refused: list[str] = field(default_factory=list)

    def refuse(self, why: str) -> None:
        if len(self.refused) < 100:
            self.refused.append(why)
        log.warning("job %d: refused a message of its training process: %s", self.job_id, why)

    def checkpoint_path(self, raw: Any) -> str | None:
        """A checkpoint must lie inside the job's own folder: the worker lists it, and ``resume`` reads it."""
        if not isinstance(raw, str):
            self.refuse(f"a checkpoint path must be a string, got {type(raw).__name__}")
            return None
        if not Path(raw).resolve().is_relative_to(self.output_dir.resolve()):
            self.refuse(f"checkpoint {raw!r} is outside the job's folder {self.output_dir}")
            return None
        return raw


class ChildFailed(RuntimeError):
    """The training process raised; ``str`` is its own error line, ``traceback`` its traceback."""

    def __init__(self, message: str, tb: str = "") -> None:
        super().__init__(message)
        self.traceback = tb


class Pump:
    """Reads the child's message lines and hands each checked one on: events to the sinks, progress and
    checkpoints to the job (retried, as ``CheckpointWatcher`` does), the outcome to ``outcome``."""

    def __init__(self, check: Checked, sinks: Sequence[Any], on_checkpoint: Callable[..., None],
                 on_step: Callable[[int], None]) -> None:
        self.check, self.sinks = check, sinks
        self.reporter = CheckpointWatcher(on_checkpoint, on_step)
        self.on_checkpoint, self.on_step = on_checkpoint, on_step
        self.outcome: Outcome | None = None
        self.failure: ChildFailed | None = None
        self.last_step = 0  # the last step the child reported done
        self._pending = b""

    def feed(self, chunk: bytes) -> None:
        self._pending += chunk
        *lines, self._pending = self._pending.split(b"\n")
        if len(self._pending) > MAX_MESSAGE_BYTES:
            self.check.refuse(f"a message longer than {MAX_MESSAGE_BYTES} bytes")
            self._pending = b""
        for line in lines:
            if line.strip():
                self.handle(line)

    def handle(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            self.check.refuse("a line that is not JSON")
            return
        if not isinstance(message, dict) or message.get("job") != self.check.job_id:
            self.check.refuse(f"a message not for job {self.check.job_id}")
            return
        kind = message.get("kind")
        if kind == "event":
            event = message.get("event")
            for sink in self.sinks:
                try:
                    sink.emit(event)
                except Exception as exc:  # a bad event is dropped, not stored: the job goes on
                    self.check.refuse(f"an event that cannot be stored: {exc}")
                    return
        elif kind == "progress":
            step = message.get("step")
            if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
                self.last_step = max(self.last_step, step)
                self.reporter._report(f"the progress of step {step}", self.on_step, step)
            else:
                self.check.refuse(f"progress step {step!r}")
        elif kind == "checkpoint":
            path = self.check.checkpoint_path(message.get("path"))
            step, metrics = message.get("step"), message.get("metrics")
            if path is not None and isinstance(step, int) and step >= 0 and isinstance(metrics, dict):
                self.reporter._report(f"the checkpoint of step {step}", self.on_checkpoint, step, path, metrics)
        elif kind == "outcome":
            try:
                self.outcome = Outcome(cancelled=bool(message["cancelled"]),
                                       final_metrics=dict(message["final_metrics"]), last_step=int(message["last_step"]))
            except (KeyError, TypeError, ValueError):
                self.check.refuse("an outcome without cancelled, final_metrics and last_step")
        elif kind == "error":
            self.failure = ChildFailed(clean_text(str(message.get("error", "the training process failed")), 2000),
                                       clean_text(str(message.get("traceback", "")), 20000))
        else:
            self.check.refuse(f"a message of unknown kind {kind!r}")

    @property
    def error(self) -> str | None:
        return self.reporter.error


# ------------------------------------------------------------------------------- the job's folder, by descriptor
class UnsafeFolder(RuntimeError):
    """The job's folder, or a name the worker writes in it, is a link or not what the worker made."""


class JobFolder:
    """The job's folder as the worker holds it: a directory descriptor opened once, one name at a time below
    ``AGENTFLY_RUNS_DIR`` without following a link, and the worker's own files in it (``process.log`` and the
    stop file) opened through that descriptor with ``O_NOFOLLOW``. The job owns the folder and may put a link
    or a FIFO under any name, before this run or for a later job's id: the worker never follows one, and
    replaces what is not a plain file of its own by a new one (``O_EXCL``)."""

    def __init__(self, path: Path) -> None:
        runs = Path(settings.AGENTFLY_RUNS_DIR)
        try:
            parts = Path(os.path.abspath(path)).relative_to(os.path.abspath(runs)).parts
        except ValueError:
            raise UnsafeFolder(f"{path} is not inside AGENTFLY_RUNS_DIR ({runs})") from None
        self.path = path
        fd = os.open(runs, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the operator's folder: trusted
        try:
            for name in parts:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
                try:
                    inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                except OSError as exc:
                    raise UnsafeFolder(f"{path}: {name!r} is a link or not a folder ({exc.strerror}); the worker "
                                       "follows no link a job can write: remove it and run the job again") from None
                os.close(fd)
                fd = inner
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd

    def close(self) -> None:
        os.close(self.fd)

    def _move_aside(self, name: str) -> None:
        """Rename whatever ``name`` is (a link, a folder, a FIFO, a file of the job's) out of the way; the
        rename never follows a link."""
        with contextlib.suppress(FileNotFoundError):
            os.rename(name, f".{name}.replaced-{uuid.uuid4().hex[:8]}", src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def open_log(self, name: str = "process.log") -> int:
        """``name`` for appending and reading, a plain file the worker owns, with one link: the one the
        previous run left, else a new one. Never a link, a FIFO or a hard link to a file elsewhere."""
        flags = os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        for _ in range(5):
            try:
                fd = os.open(name, flags | os.O_CREAT, 0o644, dir_fd=self.fd)
            except OSError:  # a link (ELOOP), a FIFO without a reader (ENXIO), a folder (EISDIR)
                self._move_aside(name)
                continue
            info = os.fstat(fd)
            if stat.S_ISREG(info.st_mode) and info.st_nlink == 1 and info.st_uid == os.geteuid():
                os.set_blocking(fd, True)
                return fd
            os.close(fd)
            self._move_aside(name)
        raise UnsafeFolder(f"{self.path / name} keeps being replaced; the job is stopped")

    def remove(self, name: str) -> None:
        """Remove ``name`` (the stop file of an earlier run), whatever it is, without following it."""
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            pass
        except OSError:
            self._move_aside(name)

    def create(self, name: str) -> None:
        """Make ``name`` (the stop file): a new empty file, or nothing when something is there already."""
        with contextlib.suppress(FileExistsError):
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                             dir_fd=self.fd))


def tail(fd: int, limit: int = 1500) -> str:
    """The last ``limit`` characters of the file behind ``fd``, read through it, cleaned (``clean_text``)."""
    size = os.fstat(fd).st_size
    start = max(0, size - limit * 4)
    return clean_text(os.pread(fd, size - start, start).decode(errors="replace"), limit)


def spec_fd(spec: dict[str, Any]) -> int:
    """The job's spec (config, folder, how to run it) in an in-memory file, for the child to read by descriptor."""
    fd = os.memfd_create("job-spec", os.MFD_CLOEXEC)
    os.write(fd, json.dumps(spec).encode())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


@dataclass
class Stopped:
    """How ``run_process`` ended a child that did not yield: after the stop file and the grace period."""

    after: float  # seconds from the stop request to the kill
    signal: str


def job_limits(team_slug: str) -> ResourceLimits:
    """The memory, CPU and process limits of a job of team ``team_slug``: ``AGENTFLY_JOB_LIMITS[team_slug]``,
    else its ``"*"`` entry (``webapp/settings.py``)."""
    table = settings.AGENTFLY_JOB_LIMITS
    entry = {**table.get("*", {}), **table.get(team_slug, {})}
    return ResourceLimits(memory_bytes=entry.get("memory_bytes"), cpus=entry.get("cpus"),
                          processes=entry.get("processes"))


def run_process(argv: list[str], env: dict[str, str], folder: JobFolder, pump: Pump,
                should_stop: Callable[[], bool], stop_name: str = "STOP", poll: float = 0.5,
                log: int | None = None, pass_fds: Sequence[int] = (), group: Cgroup | None = None,
                limits: ResourceLimits | None = None) -> tuple[int, Stopped | None]:
    """Run the child until it exits, feeding ``pump`` from its message pipe; write the stop file once
    ``should_stop()`` (or a report that cannot be stored) says so. A child that has not ended
    ``AGENTFLY_JOB_STOP_GRACE`` seconds later gets SIGTERM, and SIGKILL 10 s after that (a reward that
    blocks never sees the stop file). The child starts in ``group`` (its cgroup), or, where the host gave
    none, under rlimits of ``limits``. Returns its exit status and, when it was stopped so, how."""
    folder.remove(stop_name)
    read_fd, write_fd = os.pipe()
    own_log = log is None
    log_fd = folder.open_log() if log is None else log
    die = die_with(os.getpid())

    def prepare() -> None:  # in the child, before exec: its limits hold for everything it starts
        die()
        if group is not None:
            group.join()
        elif limits is not None:
            rlimits(limits)

    try:
        proc = subprocess.Popen([*argv, "--messages", str(write_fd)], env=env, stdin=subprocess.DEVNULL,
                                stdout=log_fd, stderr=log_fd, pass_fds=(write_fd, *pass_fds),
                                start_new_session=True, preexec_fn=prepare,
                                cwd=f"/proc/self/fd/{folder.fd}")  # the folder we hold, not its name
    finally:
        os.close(write_fd)
        if own_log:
            os.close(log_fd)
    asked: float | None = None
    stopped: Stopped | None = None
    grace = float(settings.AGENTFLY_JOB_STOP_GRACE)
    try:
        with os.fdopen(read_fd, "rb", buffering=0) as messages:
            while True:
                if asked is None and (should_stop() or pump.error is not None):
                    asked = time.monotonic()
                    folder.create(stop_name)
                if asked is not None and proc.poll() is None:
                    waited = time.monotonic() - asked
                    if stopped is None and waited > grace:
                        stopped = Stopped(waited, "SIGTERM")
                        terminate(proc, signal.SIGTERM)
                    elif stopped is not None and stopped.signal == "SIGTERM" and waited > grace + 10:
                        stopped = Stopped(waited, "SIGKILL")
                        terminate(proc, signal.SIGKILL)
                ended = proc.poll() is not None
                ready, _, _ = select.select([messages], [], [], 0 if ended else poll)
                if ready:
                    chunk = messages.read(1 << 20)
                    if not chunk:  # every writer (the child and its ranks) has closed the pipe
                        break
                    pump.feed(chunk)
                elif ended:
                    # The child is gone and nothing is left to read: a process it left behind may hold the
                    # pipe open forever; its cgroup's removal ends it.
                    break
        proc.wait()
    except BaseException:
        terminate(proc, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            terminate(proc, signal.SIGKILL)
            proc.wait()
        raise
    return int(proc.returncode), stopped


def terminate(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Send ``sig`` to the child's whole tree: its process group and every descendant (bubblewrap's child
    runs in a session of its own). SIGKILL of bubblewrap also ends its PID namespace, and with it the job."""
    from agentfly.resources.backends.local import descendants

    victims = descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
    for pid in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _spec(job: Any, config: dict[str, Any], output_dir: Path, node: Node | None) -> dict[str, Any]:
    return {"job": job.pk, "kind": job.kind, "config": config, "ranks": job.ranks, "resume_from": job.resume_from,
            "output_dir": str(output_dir), "node": None if node is None else [node.rank, node.count, node.endpoint]}


def run_confined(sandbox: Sandbox | None, program: Sequence[str], name: str, limits: ResourceLimits,
                 env: dict[str, str], folder: JobFolder, pump: Pump, should_stop: Callable[[], bool],
                 pass_fds: Sequence[int] = (), **kwargs: Any) -> tuple[int, Stopped | None, int]:
    """Run ``program`` in ``sandbox`` under ``limits`` through ``run_process`` (``kwargs`` go there): in a
    cgroup of its own (``agentfly/<name>-<random>``), removed after with every process the job left behind;
    where the host gives none, as rlimits set inside the sandbox (``confined``), or before exec when there is
    no sandbox. The child gets ``pass_fds`` and the descriptors its sandbox's command line names (the caller
    closes both). Returns the exit status, how it was stopped, and how many processes its memory limit killed."""
    group = Cgroup.create(f"{name}-{uuid.uuid4().hex[:8]}", limits)
    inside = limits if group is None and sandbox is not None else None
    try:
        argv = confined(sandbox, program, inside)  # before reading sandbox.fds: making the argv adds to them
        code, stopped = run_process(argv, env, folder, pump, should_stop, group=group,
                                    limits=limits if sandbox is None else None,
                                    pass_fds=[*pass_fds, *(sandbox.fds if sandbox is not None else [])], **kwargs)
        return code, stopped, group.oom_kills() if group is not None else 0
    finally:
        if group is not None:
            group.remove()  # and every process the job left behind with it


def run_job(job: Any, config: dict[str, Any], *, output_dir: Path, sinks: Sequence[Any],
            should_stop: Callable[[], bool], on_checkpoint: Callable[..., None], on_step: Callable[[int], None],
            node: Node | None = None, env: dict[str, str] | None = None) -> Outcome:
    """Run ``job`` (its ``config``) in its team's sandbox and return its outcome; the worker's side of
    ``webapp.jobs.body.run``, which runs inside. Raises ``ChildFailed`` with the trainer's own error,
    ``TrackingError`` when progress or checkpoints could not be stored. ``env``: variables the training
    process gets besides its own (``webapp.jobs.apis.credential``). A job stopped because it did not yield
    after a stop request ends as cancelled at its last reported step (its last checkpoint is kept)."""
    folder = JobFolder(output_dir)
    fds: list[int] = []
    sandbox: Sandbox | None = None
    try:
        sandbox = sandbox_for(job, output_dir, config, env) if enabled() else None
        fds.append(spec_fd(_spec(job, config, output_dir, node)))
        program = command(["run", "--spec-fd", str(fds[0])])
        pump = Pump(Checked(job.pk, output_dir), sinks, on_checkpoint, on_step)
        started = time.monotonic()
        log_fd = folder.open_log()
        fds.append(log_fd)
        limits = job_limits(job.team.slug)
        code, stopped, oom_kills = run_confined(
            sandbox, program, f"job-{job.pk}", limits, process_env(sandbox, env), folder, pump, should_stop,
            log=log_fd, pass_fds=[fd for fd in fds if fd != log_fd])
        killed_for_memory = oom_kills > 0
        if pump.error is not None:
            raise TrackingError(pump.error)
        if killed_for_memory and pump.outcome is None:
            raise ChildFailed(f"the training process used more than its memory limit ({limits.memory_bytes} bytes, "
                              "AGENTFLY_JOB_LIMITS) and was killed; the last checkpoint is kept. Its output ends: "
                              f"{tail(log_fd)}")
        if stopped is not None:
            for sink in sinks:
                with contextlib.suppress(Exception):
                    sink.emit(stop_event(pump.last_step, stopped))
            return Outcome(cancelled=True, final_metrics={}, last_step=pump.last_step)
        if pump.failure is not None:
            raise pump.failure
        if pump.outcome is None or code != 0:
            how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
            raise ChildFailed(f"the training process {how} after {time.monotonic() - started:.0f} s without a "
                              f"result; the last checkpoint is kept, resume the job to continue. Its output ends: "
                              f"{tail(log_fd)}")
        return pump.outcome
    finally:
        for fd in {*fds, *(sandbox.fds if sandbox is not None else [])}:
            os.close(fd)
        folder.close()


def stop_event(step: int, stopped: Stopped) -> Any:
    """The log line a job stopped from outside shows."""
    from trainer.events import log_event

    return log_event(step, f"the training process did not stop within {settings.AGENTFLY_JOB_STOP_GRACE:g} s "
                           f"of being asked to (cancel, or its time slice ended) and was ended with {stopped.signal} "
                           f"{stopped.after:.0f} s after the request; its last checkpoint is kept", "warning")


def run_node(job: Any, config: dict[str, Any], *, output_dir: Path, node: Node, job_ended: Callable[[], bool],
             env: dict[str, str] | None = None) -> int:
    """Node ``node.rank`` (> 0) of a multi-node job in its team's sandbox (``body.run_node`` inside); stops
    it when ``job_ended()``. Returns its exit status."""
    folder = JobFolder(output_dir)
    fds: list[int] = []
    sandbox: Sandbox | None = None
    try:
        sandbox = sandbox_for(job, output_dir, config, env) if enabled() else None
        fds.append(spec_fd(_spec(job, config, output_dir, node)))
        program = command(["node", "--spec-fd", str(fds[0])])
        pump = Pump(Checked(job.pk, output_dir), [], lambda *_: None, lambda _: None)
        code, _, _ = run_confined(sandbox, program, f"job-{job.pk}-node-{node.rank}", job_limits(job.team.slug),
                                  process_env(sandbox, env), folder, pump, job_ended,
                                  stop_name=f"ENDED-node-{node.rank}", poll=2.0, pass_fds=fds)
        return code
    finally:
        for fd in {*fds, *(sandbox.fds if sandbox is not None else [])}:
            os.close(fd)
        folder.close()


def format_failure(exc: BaseException) -> tuple[str, str]:
    """The error line and traceback a failed job shows: the training process's own, when it was its error."""
    if isinstance(exc, ChildFailed):
        return clean_text(str(exc), 4000), clean_text(exc.traceback or traceback.format_exc(), 20000)
    return clean_text(f"{type(exc).__name__}: {exc}", 4000), clean_text(traceback.format_exc(), 20000)
