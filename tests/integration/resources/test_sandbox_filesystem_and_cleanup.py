"""The local sandbox's view of the disk, and what is left when its owner is SIGKILLed: nothing.

Real ``PythonSandbox`` processes, a real parent process killed with SIGKILL, and the real sweep.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import agentfly
from agentfly.resources import PythonSandbox, sweep_sandboxes

ROOT = Path(agentfly.__file__).resolve().parents[1]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


def git_head(root: Path) -> Path:
    """``.git/HEAD``, or in a git worktree (where ``.git`` is a file) the HEAD of the worktree's git dir."""
    dot_git = root / ".git"
    if dot_git.is_dir():
        return dot_git / "HEAD"
    return Path(dot_git.read_text().split("gitdir:", 1)[1].strip()) / "HEAD"


async def test_the_sandbox_cannot_read_the_project_root_or_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # As a Celery worker runs: from the project root, with the root on sys.path.
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT))
    async with PythonSandbox() as box:
        if not box.isolation()["filesystem"].startswith("landlock"):
            pytest.skip(f"filesystem isolation not in effect here: {box.isolation()['filesystem']}")
        secrets = [ROOT / "webapp" / "settings.py", ROOT / "pyproject.toml", git_head(ROOT)]
        for path in secrets:
            assert path.is_file()
            # Not in the sandbox's root at all (bubblewrap), or refused (Landlock, where bubblewrap is not used).
            out = await box.run(f"open({str(path)!r}).read()")
            assert "FileNotFoundError" in out or "PermissionError" in out, path
        assert "PermissionError" in await box.run(f"import os; os.listdir({str(ROOT)!r})")
        assert await box.run("import json, math; json.dumps(math.floor(2.5))") == "'2'\n"

    # The demo's SQLite file (users and password hashes) in the working directory of the parent.
    database = tmp_path / "webapp.sqlite3"
    with sqlite3.connect(database) as db:
        db.execute("create table auth_user (password text)")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    async with PythonSandbox() as box:
        out = await box.run(f"open({str(database)!r}, 'rb').read()")
        assert "PermissionError" in out or "FileNotFoundError" in out
        assert "unable to open database file" in await box.run(
            f"import sqlite3; sqlite3.connect({str(database)!r}).execute('select * from auth_user').fetchall()")
        assert await box.run("open('mine.txt', 'w').write('ok')") == "2\n"  # its own folder stays writable


# A parent that starts a sandbox, lets the sandboxed code start a grandchild (in the sandbox's session, and
# one that left it with setsid), reports the pids, and keeps the sandbox busy (an idle one would also exit
# when its stdin closes) until it is killed.
PARENT = textwrap.dedent("""
    import asyncio, json, sys
    from agentfly.resources import PythonSandbox
    from agentfly.resources.backends.local import host_pid

    async def main():
        box = PythonSandbox()
        await box.start()
        out = await box.run(
            "import subprocess\\n"
            "a = subprocess.Popen(['sleep', '120'])\\n"
            "b = subprocess.Popen(['sleep', '120'], start_new_session=True)\\n"
            "print(a.pid, b.pid)")
        # The sandbox prints pids of its own process namespace; the host's are found below its interpreter.
        children = [host_pid(box.pid, int(p)) or int(p) for p in out.split()]
        print(json.dumps({"pid": box.pid, "workdir": box.workdir, "children": children,
                          "user": box.isolation().get("user", ""),
                          "filesystem": box.isolation().get("filesystem", "")}), flush=True)
        await box.run("import time; open('busy', 'w').close(); time.sleep(120)", timeout=300)

    asyncio.run(main())
""")


def orphan_a_sandbox(boxes: Path) -> dict:
    """Run PARENT with its sandbox folders under ``boxes`` and SIGKILL it while its sandbox is busy; return
    the report."""
    env = {**os.environ, "AGENTFLY_SANDBOX_DIR": str(boxes), "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, env=env)
    assert parent.stdout is not None
    try:
        report = json.loads(parent.stdout.readline())
        deadline = time.monotonic() + 10
        while not Path(report["workdir"], "busy").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        parent.kill()  # SIGKILL: no atexit, no signal handler, no finally runs in the parent
        parent.wait(10)
    return report


@pytest.fixture
def boxes(tmp_path: Path) -> Iterator[Path]:
    """A sandbox root of the test's own; swept at the end, so a failing test leaves nothing running either."""
    yield tmp_path / "boxes"
    sweep_sandboxes(tmp_path / "boxes")


def test_a_sandbox_dies_with_its_sigkilled_parent(boxes: Path) -> None:
    report = orphan_a_sandbox(boxes)
    assert gone_within([report["pid"]], 5), "the sandbox outlived its parent"


NOT_ROOT = textwrap.dedent("""
    import asyncio, json, os, signal
    from agentfly.resources import InfrastructureFailure, PythonSandbox

    async def main():
        box = PythonSandbox()
        await box.start()
        faked = await box.run("import os, signal; os.kill(os.getpid(), signal.SIGKILL); print('still here')")
        asyncio.get_running_loop().call_later(0.3, os.kill, box.pid, signal.SIGKILL)
        try:
            await box.run("import time; time.sleep(10)")
            outside = None
        except InfrastructureFailure as exc:
            outside = exc.kind
        print(json.dumps({"euid": os.geteuid(), "faked": faked, "outside": outside, "pid": box.pid,
                          "process": box.isolation().get("process", "")}), flush=True)
        await box.run("import time; time.sleep(120)", timeout=300)

    asyncio.run(main())
""")


def test_a_sandbox_of_an_owner_that_is_not_root_cannot_fake_an_outside_kill_and_dies_with_its_owner(
        boxes: Path) -> None:
    # Not root, the interpreter keeps its owner's uid and is PID 1 of bubblewrap's own namespace (``--as-pid-1``);
    # root makes a namespace of its own below bubblewrap's (the tests above). A user namespace that maps the
    # owner to uid 1000 makes a real owner that is not root, with bubblewrap and the kernel as they are.
    env = {**os.environ, "AGENTFLY_SANDBOX_DIR": str(boxes), "PYTHONPATH": str(ROOT)}
    owner = subprocess.Popen(["unshare", "--user", "--map-user=1000", "--map-group=1000", sys.executable, "-c",
                              NOT_ROOT], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert owner.stdout is not None
    try:
        line = owner.stdout.readline()
        assert line, owner.stderr.read() if owner.stderr else ""
        report = json.loads(line)
    finally:
        owner.kill()  # SIGKILL: the sandbox must go with it
        owner.wait(10)
    assert report["euid"] == 1000 and report["process"].startswith("PID 1")
    assert report["faked"] == "still here\n"  # its own SIGKILL was dropped
    assert report["outside"] == "killed"  # one from outside is the infrastructure's
    assert gone_within([report["pid"]], 5), "the sandbox outlived its owner"


def test_the_sweep_removes_work_dirs_of_dead_owners(boxes: Path) -> None:
    report = orphan_a_sandbox(boxes)
    assert gone_within([report["pid"]], 5)
    in_session, escaped = report["children"]
    private_uid = report["user"].startswith("uid 1")  # run as root: a uid of its own, which the sweep kills
    if "bubblewrap" in report["filesystem"]:
        # A process namespace of its own: when bubblewrap dies with the parent, the kernel kills every process
        # in it, the one that left the session included. Only the folder is left for the sweep.
        assert gone_within([in_session, escaped], 5), "a sandboxed process outlived its parent"
    else:
        assert alive(in_session)  # what only the sweep can clean up
    assert Path(report["workdir"]).is_dir()

    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    kept = boxes / f"{live.pid}-0-kept"  # a live owner's folder (start time unknown: 0)
    kept.mkdir()
    try:
        removed = sweep_sandboxes(boxes)
    finally:
        live.kill()
        live.wait()
    assert removed == [Path(report["workdir"]).parent]
    assert not Path(report["workdir"]).exists() and kept.is_dir()
    assert gone_within([in_session] + ([escaped] if private_uid else []), 5), "the sweep left processes behind"
    if not private_uid:
        with contextlib.suppress(ProcessLookupError):  # without a private uid a setsid escapee is out of reach
            os.kill(escaped, signal.SIGKILL)
    assert sweep_sandboxes(boxes) == [kept]  # its owner is dead now too
