"""A sandbox is a usable POSIX environment with no capability at all, for every program it runs.

Run as root (as CI and the web app's workers do), on a host whose Python installation lives below a folder
only root may enter (/root): the sandbox must still import it, without CAP_DAC_READ_SEARCH. The official MCP
servers (``mcp-server-git``, ``mcp-server-time``, from PyPI through the ``mcp`` extra) start under the default
isolation. Nothing here skips: a host without the isolation fails these tests.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import agentfly as af
from agentfly.resources import PythonSandbox
from agentfly.resources.mcp import MCPSession

NO_CAPS = {"CapEff": "0" * 16, "CapPrm": "0" * 16, "CapBnd": "0" * 16}
READ_CAPS = """
with open('/proc/self/status') as f:
    print({l.split(':')[0]: l.split()[1] for l in f if l.startswith(('CapEff', 'CapPrm', 'CapBnd', 'Uid'))})
"""


def capabilities_of(pid: int) -> dict[str, str]:
    """CapEff, CapPrm and CapBnd of ``pid``, as the host sees them."""
    with open(f"/proc/{pid}/status") as f:
        return {line.split(":")[0]: line.split()[1] for line in f if line.startswith(("CapEff", "CapPrm", "CapBnd"))}


def test_the_tests_run_as_root_with_the_runtime_below_a_folder_others_cannot_enter() -> None:
    # The situation the sandbox must handle without any capability; elsewhere these tests prove less.
    assert os.geteuid() == 0
    assert any(not os.stat(p).st_mode & 0o001 for p in Path(sys.base_prefix).parents if p.exists()) or \
        not os.stat(Path(sys.base_prefix)).st_mode & 0o001, "the runtime is reachable by every user here"


async def test_python_code_runs_with_empty_effective_permitted_and_bounding_sets_under_a_private_uid() -> None:
    async with PythonSandbox() as box:
        seen = ast.literal_eval(await box.run(READ_CAPS))
        assert box.isolation()["capabilities"].startswith("none")
        # ... and it still imports what lives below /root (the standard library, the venv's packages).
        assert await box.run("import json, sqlite3, decimal; import numpy; print('imported')") == "imported\n"
    assert {k: v for k, v in seen.items() if k != "Uid"} == NO_CAPS
    assert int(seen["Uid"]) >= 100000


async def test_dev_null_zero_and_urandom_work_and_subprocess_with_devnull_and_git_run() -> None:
    async with PythonSandbox() as box:
        out = await box.run(
            "import subprocess\n"
            "open('/dev/null', 'w').write('gone')\n"
            "print(open('/dev/zero', 'rb').read(4), len(open('/dev/urandom', 'rb').read(16)))\n"
            "print(subprocess.run(['true'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode)\n"
            "run = lambda *a: subprocess.run(['git', *a], capture_output=True, text=True, check=True).stdout\n"
            "run('init', '-q', 'repo')\n"
            "open('repo/a.txt', 'w').write('hello')\n"
            "run('-C', 'repo', 'add', 'a.txt')\n"
            "run('-C', 'repo', '-c', 'user.name=A', '-c', 'user.email=a@example.org', 'commit', '-qm', 'first')\n"
            "print(run('-C', 'repo', 'log', '--format=%s').strip())\n")
    assert out.splitlines() == ["b'\\x00\\x00\\x00\\x00' 16", "0", "first"], out


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    """A git repository the server is given to read (readable by other users, as a shared checkout is)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for args in (["init", "-q"], ["-c", "user.name=A", "-c", "user.email=a@example.org", "commit", "-q",
                                  "--allow-empty", "-m", "the first commit"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True)
    subprocess.run(["chmod", "-R", "o+rX", str(repo)], check=True)
    return repo


async def test_the_official_git_mcp_server_starts_under_the_default_isolation_and_reads_a_repository(
        repository: Path) -> None:
    # git refuses a repository another uid owns unless told it is safe: the server's own environment says so.
    safe = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*"}
    spec = af.mcp.server("git", command=[sys.executable, "-m", "mcp_server_git", "--repository", str(repository)],
                         read_paths=[str(repository)], env=safe)
    session = MCPSession(spec)
    await session.start()
    try:
        assert {"git_log", "git_status", "git_diff"} <= {t.name for t in session.tools}
        assert "the first commit" in await session.call("git_log", {"repo_path": str(repository)})
        assert session.worker is not None and session.worker.worker_pid is not None
        caps = capabilities_of(session.worker.worker_pid)
        report = session.isolation()
    finally:
        await session.close()
    assert caps == NO_CAPS
    assert str(report["capabilities"]).startswith("none") and "bubblewrap" in str(report["filesystem"])


async def test_the_official_time_mcp_server_starts_under_the_default_isolation_with_no_capability() -> None:
    session = MCPSession(af.mcp.server("time", command=[sys.executable, "-m", "mcp_server_time"]))
    await session.start()
    try:
        answer = await session.call("get_current_time", {"timezone": "Europe/Paris"})
        assert session.worker is not None and session.worker.worker_pid is not None
        caps = capabilities_of(session.worker.worker_pid)
    finally:
        await session.close()
    assert "Europe/Paris" in answer
    assert caps == NO_CAPS
