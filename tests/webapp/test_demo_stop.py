"""`python -m webapp.demo` stops every process it started on SIGTERM and on SIGINT, also in the background."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]


def start_demo_in_background(tmp_path: Path, args: tuple[str, ...] = ("--model", "tiny", "--steps", "2")
                             ) -> tuple[subprocess.Popen[str], int]:
    # The demo's own SQLite under --dir, and its own team plugin folder (the test session's would hide it).
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "AGENTFLY_PLUGIN_DIRS")}
    # A Redis database of its own: on the test session's (13) the session's Celery worker, which serves the same
    # queues, would take the demo's job and run it against the test database instead.
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", REDIS_URL="redis://127.0.0.1:6379/14")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # A background job of a non-interactive shell: its own session, SIGINT ignored on entry (as `cmd &` does).
    proc = subprocess.Popen(
        [sys.executable, "-m", "webapp.demo", "--port", str(port), "--dir", str(tmp_path), *args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    return proc, port


def wait_for_url(proc: subprocess.Popen[str], timeout: float = 150) -> str:
    deadline = time.monotonic() + timeout
    seen = []
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        if "watch job" in line:
            return line
    raise AssertionError("the demo never printed its URL:\n" + "".join(seen))


def descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def port_is_free(port: int) -> bool:
    """Free for a new server (which sets SO_REUSEADDR, as Daphne does): closed connections in TIME_WAIT from
    the demo's own health checks do not count."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def assert_stops_everything(tmp_path: Path, sig: signal.Signals) -> None:
    proc, port = start_demo_in_background(tmp_path)
    try:
        wait_for_url(proc)
        started = descendants(proc.pid)
        names = " ".join(" ".join(p.cmdline()) for p in started)
        assert "daphne" in names and "celery" in names, names  # the web server and the worker, with its pool
        assert not port_is_free(port)
        os.kill(proc.pid, sig)
        proc.wait(15)
        _, alive = psutil.wait_procs(started, timeout=5)
        assert not alive, f"still running after {sig.name}: {[' '.join(p.cmdline()) for p in alive]}"
        assert port_is_free(port), f"port {port} is still held after {sig.name}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for p in psutil.Process().children(recursive=True):
            p.kill()


@pytest.mark.slow
def test_sigterm_stops_every_process_the_background_demo_started(tmp_path: Path) -> None:
    assert_stops_everything(tmp_path, signal.SIGTERM)


@pytest.mark.slow
def test_sigint_stops_every_process_the_background_demo_started_although_it_began_ignored(tmp_path: Path) -> None:
    assert_stops_everything(tmp_path, signal.SIGINT)
