"""The worker follows no path a job can write, quotes a job's output cleaned and bounded, and stops a job that
does not yield.

The job owns its folder (it runs as its team's uid there), so it may plant a link, a FIFO or a folder under
any name the worker uses, for this run or for a later job's id. Each test plants one as a hostile reward
would and runs a real child process through the worker's own ``run_process``, as root, as CI does.
"""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from webapp.jobs.isolation import Checked, JobFolder, Pump, UnsafeFolder, run_process, tail

pytestmark = pytest.mark.django_db


@pytest.fixture
def runs(tmp_path: Path, settings: Any) -> Path:
    settings.AGENTFLY_RUNS_DIR = tmp_path / "runs"
    settings.AGENTFLY_JOB_STOP_GRACE = 1.0
    (tmp_path / "runs" / "team-a").mkdir(parents=True)
    return tmp_path / "runs"


def run_child(folder: JobFolder, code: str, should_stop: Any = lambda: False) -> tuple[int, Any, str]:
    """Run ``python -c code`` as the worker runs a job's process (its output into ``process.log``), and return
    its exit status, how it was stopped, and the tail the worker would quote."""
    pump = Pump(Checked(1, folder.path), [], lambda *_: None, lambda _: None)
    log = folder.open_log()
    try:
        code_, stopped = run_process([sys.executable, "-c", code], {"PATH": "/usr/bin:/bin"}, folder, pump,
                                     should_stop, poll=0.1, log=log)
        return code_, stopped, tail(log)
    finally:
        os.close(log)


def test_a_process_log_linked_to_etc_shadow_is_replaced_and_the_error_quotes_only_the_jobs_output(
        runs: Path) -> None:
    job = runs / "team-a" / "job-1"
    job.mkdir()
    (job / "process.log").symlink_to("/etc/shadow")
    before = Path("/etc/shadow").read_bytes()
    folder = JobFolder(job)
    try:
        status, _, quoted = run_child(folder, "print('the reward failed'); raise SystemExit(1)")
    finally:
        folder.close()
    assert status == 1
    assert quoted == "the reward failed\n"
    assert Path("/etc/shadow").read_bytes() == before
    assert not (job / "process.log").is_symlink()
    moved = [p for p in job.iterdir() if p.name.startswith(".process.log.replaced-")]
    assert len(moved) == 1 and moved[0].is_symlink()  # moved aside, never opened


def test_a_log_linked_to_proc_self_environ_never_puts_the_workers_environment_in_an_error(
        runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTFLY_TEST_WORKER_SECRET", "hunter2")
    job = runs / "team-a" / "job-1"
    job.mkdir()
    (job / "process.log").symlink_to("/proc/self/environ")
    folder = JobFolder(job)
    try:
        _, _, quoted = run_child(folder, "import sys; sys.stderr.write('boom\\x00\\x1b[31m red\\n'); sys.exit(3)")
    finally:
        folder.close()
    assert "hunter2" not in quoted
    assert quoted == "boom[31m red\n"  # NUL and the escape byte are gone


def test_links_planted_for_later_job_ids_are_never_followed(runs: Path, tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    (host / "passwd").write_text("root:x:0:0\n")
    # A whole folder for the next job id, pointing at a host folder.
    (runs / "team-a" / "job-2").symlink_to(host)
    with pytest.raises(UnsafeFolder, match="'job-2' is a link or not a folder"):
        JobFolder(runs / "team-a" / "job-2")
    # A real folder for a later id, whose log and stop file are links to host files.
    later = runs / "team-a" / "job-3"
    later.mkdir()
    (later / "process.log").symlink_to(host / "passwd")
    (later / "STOP").symlink_to(host / "created-by-the-worker")
    folder = JobFolder(later)
    try:
        run_child(folder, "print('attacker-controlled line')", should_stop=lambda: True)
    finally:
        folder.close()
    assert (host / "passwd").read_text() == "root:x:0:0\n"
    assert sorted(p.name for p in host.iterdir()) == ["passwd"]
    assert (later / "STOP").is_file() and not (later / "STOP").is_symlink()


def test_a_fifo_planted_as_the_log_does_not_hang_the_worker(runs: Path) -> None:
    job = runs / "team-a" / "job-1"
    job.mkdir()
    os.mkfifo(job / "process.log")
    folder = JobFolder(job)
    try:
        _, _, quoted = run_child(folder, "print('ran')")
    finally:
        folder.close()
    assert quoted == "ran\n"
    # The worker never opened the FIFO (an open for writing would block until a reader came): it moved it aside.
    [moved] = [p for p in job.iterdir() if p.name.startswith(".process.log.replaced-")]
    assert stat.S_ISFIFO(moved.lstat().st_mode) and stat.S_ISREG((job / "process.log").lstat().st_mode)


@pytest.mark.slow
def test_a_process_that_ignores_the_stop_file_and_sigterm_is_killed_within_the_grace_period(runs: Path) -> None:
    # A reward that blocks forever, deaf to SIGTERM: it never sees the stop file between steps.
    job = runs / "team-a" / "job-1"
    job.mkdir()
    folder = JobFolder(job)
    try:
        started = time.monotonic()
        status, stopped, _ = run_child(
            folder, "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: time.sleep(1)",
            should_stop=lambda: True)
    finally:
        folder.close()
    assert stopped is not None and stopped.signal == "SIGKILL"
    assert status == -9
    assert time.monotonic() - started < 1.0 + 10 + 5  # the grace, SIGTERM's 10 s, and slack


def test_an_error_and_metrics_with_nul_bytes_are_stored_cleaned_and_the_job_never_stays_running(
        team_a: Any, alice: Any) -> None:
    from webapp.jobs.models import Status, TrainingJob
    from webapp.jobs.worker import finish_job

    job = TrainingJob.objects.create(team=team_a, created_by=alice, name="nul", config={"steps": 1},
                                     status=Status.RUNNING)
    ended = finish_job(job.pk, Status.FAILED, error="bad\x00 output\x1b[2J", final_metrics={"answer": "a\x00b"})
    job.refresh_from_db()
    assert ended == Status.FAILED and job.status == Status.FAILED
    assert job.error.startswith("bad output[2J; its final metrics could not be stored")
    assert job.final_metrics == {}


@pytest.fixture
def shared_model(tmp_path: Path, settings: Any) -> Path:
    """A model folder in a shared folder the operator allows, readable by a team's uid."""
    shared = tmp_path / "shared"
    (shared / "model").mkdir(parents=True)
    (shared / "model" / "weights.txt").write_text("allowed weights\n")
    for folder in (tmp_path, shared, shared / "model"):
        folder.chmod(0o755)
    settings.AGENTFLY_ALLOWED_PATHS = [str(shared)]
    return shared / "model"


def flip(link: Path, target: str) -> None:
    """Point ``link`` at ``target`` in one step (a rename over it), as a job racing the worker would."""
    new = link.with_name(link.name + ".new")
    new.symlink_to(target)
    new.replace(link)


def run_sandboxed(runs: Path, team: Any, script: str, **sandbox: Any) -> Any:
    """Run ``sh -c script`` in job 1's sandbox of ``team`` (its output folder made and handed to the team's
    uid, ``sandbox`` as the rest of the ``Sandbox``) as the worker starts a job; the descriptors it passes are
    closed after. Returns the finished process."""
    import subprocess

    from webapp.jobs import isolation

    output = runs / team.slug / "job-1"
    output.mkdir()
    uid = isolation.TEAM_UID_BASE + team.pk
    os.chown(output, uid, uid)
    box = isolation.Sandbox(job_id=1, team_slug=team.slug, output_dir=output, writable=[output], uid=uid, **sandbox)
    try:
        return subprocess.run([*isolation.sandbox_argv(box), "/bin/sh", "-c", script],
                              env=isolation.process_env(box), capture_output=True, text=True, timeout=60,
                              pass_fds=box.fds)
    finally:
        for fd in box.fds:
            os.close(fd)


def test_a_link_flipped_in_the_team_folder_after_the_check_mounts_only_what_was_checked(
        runs: Path, shared_model: Path, team_a: Any) -> None:
    from webapp.jobs import isolation

    link = runs / "team-a" / "model"
    link.symlink_to(shared_model)
    planned = isolation.config_mounts({"model": {"path": str(link)}}, team_a)
    assert [where for _, where in planned] == [str(shared_model)]
    flip(link, "/run/postgresql")  # the race: after the check, before the sandbox starts
    done = run_sandboxed(runs, team_a, f"cat {shared_model}/weights.txt; ls /run/postgresql 2>&1 | head -1",
                         readable_fds=planned, fds=[fd for fd, _ in planned])
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first == "allowed weights"
    assert "No such file" in second  # PostgreSQL's folder is not in the sandbox


def test_a_link_flipped_before_the_check_is_refused_and_nothing_is_mounted(
        runs: Path, shared_model: Path, team_a: Any) -> None:
    from webapp.jobs import isolation, paths

    link = runs / "team-a" / "model"
    link.symlink_to(shared_model)
    paths.check_config({"model": {"path": str(link)}}, team_a)  # the launch's check passes
    flip(link, "/run/postgresql")
    with pytest.raises(paths.PathRefused, match=r"model.path: .*it is '/run/postgresql' now"):
        isolation.config_mounts({"model": {"path": str(link)}}, team_a)


def test_a_plugin_folder_removed_after_the_job_was_planned_leaves_the_job_starting_without_it(
        runs: Path, team_a: Any, tmp_path: Path, settings: Any) -> None:
    from webapp.jobs import isolation

    plugins = tmp_path / "plugins"
    (plugins / "team-a").mkdir(parents=True)
    (plugins / "shared_words.py").write_text("WORDS = 1\n")
    for folder in (tmp_path, plugins, plugins / "team-a"):
        folder.chmod(0o755)
    settings.AGENTFLY_PLUGIN_DIRS = [plugins]
    readable = isolation.plugin_mounts("team-a")
    assert plugins / "team-a" in readable
    (plugins / "team-a").rmdir()  # the race: the team's folder goes after the plan, before bubblewrap starts
    done = run_sandboxed(runs, team_a, f"cat {plugins}/shared_words.py; echo started", readable=readable)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["WORDS = 1", "started"]


def run_limited(folder: JobFolder, code: str, limits: Any) -> tuple[int, str, int]:
    """Run ``python -c code`` in a cgroup with ``limits``, as the worker runs a job; return its exit status,
    its output's tail and how many of its processes the memory limit killed. The group is removed after."""
    from agentfly.resources.backends.cgroups import Cgroup

    group = Cgroup.create(f"test-{os.getpid()}-{time.monotonic_ns()}", limits)
    assert group is not None, "this host lets a root worker make cgroups: the limits must hold"
    pump = Pump(Checked(1, folder.path), [], lambda *_: None, lambda _: None)
    log = folder.open_log()
    try:
        status, _ = run_process([sys.executable, "-c", code], {"PATH": "/usr/bin:/bin"}, folder, pump,
                                lambda: False, poll=0.1, log=log, group=group, limits=limits)
        return status, tail(log), group.oom_kills()
    finally:
        os.close(log)
        group.remove()


def test_a_job_allocating_past_its_memory_limit_is_killed_by_its_cgroup(runs: Path) -> None:
    from agentfly.resources.backends.cgroups import ResourceLimits

    job = runs / "team-a" / "job-1"
    job.mkdir()
    folder = JobFolder(job)
    try:
        status, _, oom_kills = run_limited(
            folder, "chunks = []\nfor i in range(60):\n    chunks.append(bytearray(64 << 20))\nprint('allocated')",
            ResourceLimits(memory_bytes=256 << 20))
    finally:
        folder.close()
    assert status == -9  # the kernel's OOM kill, inside the group: 3.75 GiB was never reached
    assert oom_kills >= 1


def test_a_job_forking_300_processes_is_held_at_its_process_limit_and_leaves_none_behind(runs: Path) -> None:
    from agentfly.resources.backends.cgroups import ResourceLimits

    job = runs / "team-a" / "job-1"
    job.mkdir()
    folder = JobFolder(job)
    code = ("import os, time\nstarted = 0\nfor i in range(300):\n    try:\n        if os.fork() == 0:\n"
            "            time.sleep(600)\n            os._exit(0)\n        started += 1\n    except OSError:\n"
            "        break\nprint('started', started)")
    try:
        status, output, _ = run_limited(folder, code, ResourceLimits(processes=64))
    finally:
        folder.close()
    assert status == 0
    assert output.startswith("started ") and int(output.split()[1]) < 64, output
    assert not [p for p in psutil.process_iter(["cmdline"]) if "time.sleep(600)" in " ".join(p.info["cmdline"] or [])]


# A worker that is not root (the compose stack's `agentfly` user) runs each job in a user namespace of its own.
# This runs the worker's own ``run_confined`` as such a user, where the host gives it no cgroup: in a mount
# namespace of its own where /root (a 0700 folder holding this Python) is a tmpfs others may cross, with the
# Python installation moved back in, so the unprivileged user runs the same interpreter and code.
WORKER_UID = 4_242_424
AS_A_USER_WORKER = """
import os, sys
import django
django.setup()
from pathlib import Path
from agentfly.resources.backends.cgroups import ResourceLimits
from webapp.jobs.isolation import Checked, JobFolder, Pump, Sandbox, run_confined, tail
out = Path(sys.argv[1]) / "team-a" / "job-1"
folder = JobFolder(out)
pump = Pump(Checked(1, out), [], lambda *_: None, lambda _: None)
log = folder.open_log()
status, _, _ = run_confined(Sandbox(job_id=1, team_slug="team-a", output_dir=out, writable=[out]),
                            [sys.executable, "-c", sys.argv[2]], "test", ResourceLimits(processes=64),
                            {"PATH": "/usr/bin:/bin"}, folder, pump, lambda: False, poll=0.1, log=log)
print(status, tail(log).strip())
"""
THREADS = ("import threading\nhold = threading.Event()\nstarted = 0\ntry:\n    for _ in range({n}):\n"
           "        threading.Thread(target=hold.wait, daemon=True).start()\n        started += 1\nexcept RuntimeError:\n"
           "    pass\nprint('started', started)\nhold.set()")


def as_a_user_worker(code: str, runs: Path) -> tuple[int, int]:
    """Run ``code`` as a job of a worker whose uid is ``WORKER_UID``; return its exit status and the number
    it printed last."""
    import subprocess

    python = Path(sys.executable).resolve().parents[1]  # the installation (pyenv's or the system's)
    move = (f"mkdir -p /run/agentfly-test-python && mount --bind {python} /run/agentfly-test-python && "
            f"mount -t tmpfs -o mode=0711 tmpfs /root && mkdir -p {python} && "
            f"mount --move /run/agentfly-test-python {python} && " if python.is_relative_to("/root") else "")
    env = {k: v for k, v in os.environ.items() if k.startswith(("DATABASE", "DJANGO", "SECRET", "REDIS"))}
    env.update({"PYTHONPATH": str(Path(__file__).resolve().parents[3]), "AGENTFLY_RUNS_DIR": str(runs),
                "DJANGO_SETTINGS_MODULE": "webapp.settings", "DEBUG": "1", "HOME": str(runs)})
    worker = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-ec",
         f'{move}exec setpriv --reuid={WORKER_UID} --regid={WORKER_UID} --clear-groups -- "$@"', "sh",
         sys.executable, "-c", AS_A_USER_WORKER, str(runs), code],
        env=env, capture_output=True, text=True, timeout=120, cwd=runs)
    assert worker.returncode == 0, worker.stderr[-3000:]
    status, *_, last = worker.stdout.split()
    assert last.isdigit(), worker.stdout
    return int(status), int(last)


def test_a_non_root_workers_job_gets_its_threads_however_many_the_workers_uid_runs_and_a_fork_bomb_is_held(
        tmp_path: Path) -> None:
    import subprocess
    import tempfile

    assert os.geteuid() == 0, "the test plays a non-root worker by dropping root's uid: run it as root, as CI does"
    runs = Path(tempfile.mkdtemp(prefix="agentfly-user-worker-"))
    (runs / "team-a").mkdir()
    for folder in (runs, runs / "team-a"):
        os.chown(folder, WORKER_UID, WORKER_UID)
    # The worker's uid holds 200 threads elsewhere (in the compose stack: Ray's head and node, Celery, Daphne).
    elsewhere = subprocess.Popen(
        ["setpriv", f"--reuid={WORKER_UID}", f"--regid={WORKER_UID}", "--clear-groups", "--", "/usr/bin/python3",
         "-c", THREADS.format(n=200).replace("hold.set()", "import time; time.sleep(120)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert elsewhere.stdout is not None and elsewhere.stdout.readline().split() == ["started", "200"]
        status, started = as_a_user_worker(THREADS.format(n=20), runs)
        assert (status, started) == (0, 20)  # its limit of 64 counts its own processes, not the uid's 200
        status, started = as_a_user_worker(THREADS.format(n=300), runs)
        assert status == 0 and 50 < started < 64, started  # and still holds: a thread past it fails
    finally:
        elsewhere.kill()
        elsewhere.wait()
        subprocess.run(["rm", "-rf", str(runs)], check=False)
