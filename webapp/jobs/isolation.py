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
and ends with a checkpoint. The sandbox dies with the worker (``--die-with-parent``).
"""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

from agentfly.resources.backends.local import SANDBOX_MARK
from webapp.jobs import paths
from webapp.jobs.body import CheckpointWatcher, Node, Outcome, TrackingError, die_with
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
    network: str = "none"  # "none" (own loopback) or "host"
    env: dict[str, str] = field(default_factory=dict)
    uid: int | None = None  # the team's own uid (``team_uid``) when the worker is root; None: the worker's


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


def config_reads(config: dict[str, Any], team: Any, resume_from: str = "") -> list[Path]:
    """The paths the job's config (and the checkpoint it resumes from) reads outside its team's runs folder (a
    shared model or data set), each already allowed for the team by ``paths.check_config``."""
    runs = Path(settings.AGENTFLY_RUNS_DIR).resolve()
    found = []
    for _, raw in paths.config_paths(config, resume_from):
        path = Path(raw).resolve()
        if path.exists() and not path.is_relative_to(runs):
            found.append(path)
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
    two = {"--ro-bind", "--bind", "--dev-bind", "--symlink", "--ro-bind-data"}
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
        name = f"job-{sandbox.job_id}"
        hosts = sandbox.output_dir / ".sandbox-hosts"
        hosts.write_text(f"127.0.0.1 localhost {name}\n::1 localhost ip6-localhost ip6-loopback\n")
        argv += ["--hostname", name]
        mounts += ["--ro-bind", str(hosts), "/etc/hosts"]
    mounts += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp", "--perms", "1777",
               "--tmpfs", "/dev/shm"]
    mounts += _gpu_mounts()
    for path in _python_mounts():
        mounts += _bind("--ro-bind", path)
    for name in CODE:
        mounts += _bind("--ro-bind", ROOT / name)
    for path in sandbox.readable:
        mounts += _bind("--ro-bind", path)
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


def sandbox_for(job: Any, output_dir: Path, config: dict[str, Any], env: dict[str, str] | None = None) -> Sandbox:
    """The sandbox of ``job``: its team's runs folder read-write, the code, shared plugins and the paths its
    config reads read-only; ``env`` besides (its team's Redis URL for its APIs)."""
    team_runs = paths.team_dir(job.team)
    team_runs.mkdir(parents=True, exist_ok=True)
    uid = team_uid(job.team)
    if uid is not None:
        # The team's uid owns its runs folder and the job's folder (not what is inside: the worker's own files
        # stay the worker's), so the job writes there without any capability. No symlink is followed.
        for folder in (team_runs, output_dir):
            os.chown(folder, uid, uid, follow_symlinks=False)
    readable = [*plugin_mounts(job.team.slug), *config_reads(config, job.team, job.resume_from)]
    for name in ("HF_HOME", "HF_HUB_CACHE", "TRANSFORMERS_CACHE"):
        if os.environ.get(name) and Path(os.environ[name]).is_dir():
            readable.append(Path(os.environ[name]).resolve())  # downloaded models, shared read-only
    return Sandbox(job_id=job.pk, team_slug=job.team.slug, output_dir=output_dir.resolve(),
                   writable=[team_runs.resolve()], readable=readable, network=network_for(config, job.nodes),
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


def command(sandbox: Sandbox | None, args: Sequence[str]) -> list[str]:
    """``python -m webapp.jobs.child ARGS``, inside ``sandbox`` (None: unisolated, AGENTFLY_JOB_SANDBOX=off)."""
    python = [sys.executable, "-P", "-m", "webapp.jobs.child", *args]
    return python if sandbox is None else [*sandbox_argv(sandbox), *python]


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
            self.failure = ChildFailed(str(message.get("error", "the training process failed"))[:2000],
                                       str(message.get("traceback", ""))[-20000:])
        else:
            self.check.refuse(f"a message of unknown kind {kind!r}")

    @property
    def error(self) -> str | None:
        return self.reporter.error


def run_process(argv: list[str], env: dict[str, str], output_dir: Path, pump: Pump,
                should_stop: Callable[[], bool], stop_name: str = "STOP", poll: float = 0.5) -> int:
    """Run the child until it exits, feeding ``pump`` from its message pipe; write the stop file once
    ``should_stop()`` (or a report that cannot be stored) says so. Returns its exit status."""
    stop_file = output_dir / stop_name
    stop_file.unlink(missing_ok=True)
    read_fd, write_fd = os.pipe()
    err_log = output_dir / "process.log"
    try:
        with err_log.open("ab") as errors:
            proc = subprocess.Popen([*argv, "--messages", str(write_fd)], env=env, stdin=subprocess.DEVNULL,
                                    stdout=errors, stderr=errors, pass_fds=(write_fd,),
                                    start_new_session=True, preexec_fn=die_with(os.getpid()), cwd=output_dir)
    finally:
        os.close(write_fd)
    stopping = False
    try:
        with os.fdopen(read_fd, "rb", buffering=0) as messages:
            while True:
                if not stopping and (should_stop() or pump.error is not None):
                    stopping = True
                    stop_file.touch()
                ready, _, _ = select.select([messages], [], [], poll)
                if ready:
                    chunk = messages.read(1 << 20)
                    if not chunk:  # every writer (the child and its ranks) has closed the pipe
                        break
                    pump.feed(chunk)
        proc.wait()
    except BaseException:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        raise
    return int(proc.returncode)


def run_job(job: Any, config: dict[str, Any], *, output_dir: Path, sinks: Sequence[Any],
            should_stop: Callable[[], bool], on_checkpoint: Callable[..., None], on_step: Callable[[int], None],
            node: Node | None = None, env: dict[str, str] | None = None) -> Outcome:
    """Run ``job`` (its ``config``) in its team's sandbox and return its outcome; the worker's side of
    ``webapp.jobs.body.run``, which runs inside. Raises ``ChildFailed`` with the trainer's own error,
    ``TrackingError`` when progress or checkpoints could not be stored. ``env``: variables the training
    process gets besides its own (``webapp.jobs.apis.credential``)."""
    sandbox = sandbox_for(job, output_dir, config, env) if enabled() else None
    spec = output_dir / "job.json"  # read by the child: the config and how to run it, nothing secret
    spec.write_text(json.dumps({"job": job.pk, "kind": job.kind, "config": config, "ranks": job.ranks,
                                "resume_from": job.resume_from,
                                "node": None if node is None else [node.rank, node.count, node.endpoint]}))
    pump = Pump(Checked(job.pk, output_dir), sinks, on_checkpoint, on_step)
    started = time.monotonic()
    code = run_process(command(sandbox, ["run", str(spec)]), process_env(sandbox, env), output_dir,
                       pump, should_stop)
    if pump.error is not None:
        raise TrackingError(pump.error)
    if pump.failure is not None:
        raise pump.failure
    if pump.outcome is None or code != 0:
        tail = (output_dir / "process.log").read_text(errors="replace")[-1500:]
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
        raise ChildFailed(f"the training process {how} after {time.monotonic() - started:.0f} s without a result; "
                          f"the last checkpoint is kept, resume the job to continue. Its output ends: {tail}")
    return pump.outcome


def run_node(job: Any, config: dict[str, Any], *, output_dir: Path, node: Node, job_ended: Callable[[], bool],
             env: dict[str, str] | None = None) -> int:
    """Node ``node.rank`` (> 0) of a multi-node job in its team's sandbox (``body.run_node`` inside); stops
    it when ``job_ended()``. Returns its exit status."""
    sandbox = sandbox_for(job, output_dir, config, env) if enabled() else None
    spec = output_dir / f"job-node-{node.rank}.json"
    spec.write_text(json.dumps({"job": job.pk, "kind": job.kind, "config": config, "ranks": job.ranks,
                                "resume_from": job.resume_from, "node": [node.rank, node.count, node.endpoint]}))
    pump = Pump(Checked(job.pk, output_dir), [], lambda *_: None, lambda _: None)
    return run_process(command(sandbox, ["node", str(spec)]), process_env(sandbox, env), output_dir,
                       pump, job_ended, stop_name=f"ENDED-node-{node.rank}", poll=2.0)


def format_failure(exc: BaseException) -> tuple[str, str]:
    """The error line and traceback a failed job shows: the training process's own, when it was its error."""
    if isinstance(exc, ChildFailed):
        return str(exc), exc.traceback or traceback.format_exc()
    return f"{type(exc).__name__}: {exc}", traceback.format_exc()
