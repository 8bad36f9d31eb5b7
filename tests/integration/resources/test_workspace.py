"""The coding workspace on the local backend: git, pytest and POSIX programs under the default isolation, a
shell whose directory persists, bounded commands, and copy-on-write forks that share nothing they write and
leave nothing behind."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from agentfly.resources import ResourceError
from agentfly.resources.workspace import Workspace, overlay_available

PROJECT = {
    "calc.py": "def add(a, b):\n    return a - b\n",
    "tests/test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
                          "def test_zero():\n    assert add(0, 0) == 0\n",
}


def _processes_of(folder: Path) -> list[int]:
    """Host pids whose command line names ``folder`` (a workspace's overlay or bind source)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if str(folder).encode() in f.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


def _sandboxed_sleepers() -> list[int]:
    """Live ``sleep 30`` processes under a sandbox's private uid (what a command left in the background)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if f.read() != b"sleep\x0030\x00":
                        continue
                with open(f"/proc/{entry}/status") as f:
                    uid = next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
            except (OSError, StopIteration):
                continue
            if uid >= 100000:
                found.append(int(entry))
    return found


def _mounts_of(folder: Path) -> list[str]:
    """Mounts, in any process's mount namespace we can see, that name ``folder``."""
    seen = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/mountinfo") as f:
                    seen += [line for line in f if str(folder) in line]
            except OSError:
                continue
    return seen


async def test_git_pytest_and_posix_programs_work_in_a_workspace_under_the_default_isolation() -> None:
    async with Workspace() as ws:
        await ws.prepare(PROJECT)
        log = await ws.sh("git log --oneline && git status --porcelain && echo quiet > /dev/null && echo t > /tmp/t && "
                          "cat /tmp/t >/dev/null && echo ok")
        assert log.ok and "the task as given" in log.text and log.text.endswith("ok\n"), log
        tests = await ws.run_tests()
        assert tests.exit_code == 1 and "1 failed, 1 passed" in tests.text, tests.text
        # A subprocess with DEVNULL, as tools and test suites start them.
        sub = await ws.sh("python -c 'import subprocess; print(subprocess.run([\"git\", \"status\"], "
                          "stdout=subprocess.DEVNULL).returncode)'")
        assert sub.text.strip() == "0", sub
        await ws.write_file("calc.py", "def add(a, b):\n    return a + b\n")
        assert "2 passed" in (await ws.run_tests()).text
        assert "+    return a + b" in await ws.diff()
        # The default isolation: no network, a private uid, nothing of the host's project or secrets.
        closed = await ws.sh("python -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), timeout=2)'")
        assert not closed.ok and ("unreachable" in closed.text or "Network" in closed.text), closed
        who = await ws.sh("id -u; ls /root /etc/passwd 2>&1; ls /work 2>&1 | head -3")
        assert int(who.text.split()[0]) >= 100000 and "No such file" in who.text, who.text


async def test_the_shell_keeps_its_directory_and_a_long_command_is_killed_with_what_it_started() -> None:
    async with Workspace(timeout=2) as ws:
        await ws.prepare(PROJECT)
        assert (await ws.sh("cd tests")).cwd == "/workspace/tests"
        assert (await ws.sh("ls")).text.split() == ["test_calc.py"]
        slow = await ws.sh("(sleep 60 &) ; sleep 60")
        assert slow.timed_out and slow.exit_code is None and "time limit" in slow.observation()
        assert _processes_of(ws.folder) == []  # type: ignore[arg-type]
        loud = await ws.sh("yes | head -c 200000")
        assert loud.truncated > 150_000 and len(loud.text) < 20_000
        assert (await ws.sh("pwd")).text.strip() == "/workspace/tests"


async def edits_stay_in_their_fork(parent: Workspace) -> None:
    """The fork test of every backend: in a started ``parent``, prepare the project, fork it three times and
    check that no copy (nor the parent) sees another's edits, commits or later writes."""
    await parent.prepare(PROJECT)
    await parent.sh("cd tests && echo draft > notes.txt")
    kids = await parent.fork(3)
    try:
        assert all(k.cwd == "/workspace/tests" for k in kids)  # the shell's directory came along
        await kids[0].write_file("../calc.py", "def add(a, b):\n    return a + b\n")
        await kids[0].sh("rm notes.txt && git -C .. commit -qam fixed")
        await kids[1].sh("echo other >> notes.txt")
        assert "2 passed" in (await kids[0].run_tests()).text
        assert "1 failed" in (await kids[2].run_tests()).text and "1 failed" in (await parent.run_tests()).text
        assert (await parent.read_file("notes.txt")) == "draft\n"
        assert (await kids[1].read_file("notes.txt")) == "draft\nother\n"
        assert (await kids[2].read_file("notes.txt")) == "draft\n"
        logs = await asyncio.gather(*(w.sh("git log --oneline | wc -l") for w in (parent, *kids)))
        assert [int(x.text) for x in logs] == [1, 2, 1, 1]
        # The parent goes on writing after the fork, and no copy sees it.
        await parent.write_file("calc.py", "broken(")
        assert "2 passed" in (await kids[0].run_tests()).text and "1 failed" in (await kids[2].run_tests()).text
        with pytest.raises(ResourceError, match="already holds files"):
            await kids[2].prepare(PROJECT)
    finally:
        for kid in kids:
            await kid.close()


@pytest.mark.skipif(overlay_available() is not None, reason=f"forks are copies here: {overlay_available()}")
async def test_an_edit_in_one_fork_is_seen_in_no_other_fork_nor_in_the_parent() -> None:
    async with Workspace() as parent:
        await edits_stay_in_their_fork(parent)


async def test_64_forks_leave_no_file_process_or_mount_after_they_close() -> None:
    root = Workspace()
    await root.start()
    folder = root.folder
    assert folder is not None
    await root.prepare(PROJECT)
    kids = await root.fork(64)
    # Each copy runs a command (and leaves a background process behind, which must die with the command).
    results = await asyncio.gather(*(k.sh(f"(sleep 30 &); echo {i} > mine.txt; cat mine.txt")
                                     for i, k in enumerate(kids)))
    assert [r.text.strip() for r in results] == [str(i) for i in range(64)]
    assert _sandboxed_sleepers() == []  # a command's processes end with it (its own process namespace)
    grandkids = await kids[5].fork(2)
    assert (await grandkids[1].read_file("mine.txt")) == "5\n"
    for w in (*kids, *grandkids):
        await w.close()
    assert folder.exists()  # the parent still stands on the shared layers
    assert (await root.sh("ls mine.txt 2>&1")).exit_code != 0
    await root.close()
    assert not folder.exists()
    assert _processes_of(folder) == [] and _mounts_of(folder) == []
