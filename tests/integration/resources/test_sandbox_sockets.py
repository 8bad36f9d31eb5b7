"""A local sandbox reaches no Unix socket of the host: not PostgreSQL's (which trusts local connections on
this machine: the critical attack of issue 28), Redis's, Docker's, D-Bus's or systemd's, nor an abstract
socket. Each attempt is made against a socket that really listens, and the same code, unconfined, gets in.
"""

from __future__ import annotations

import os
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentfly.resources import PythonSandbox
from agentfly.resources.backends.local import Isolation, sandbox_view

POSTGRES = "/var/run/postgresql/.s.PGSQL.5432"
HOST_SOCKETS = [POSTGRES, "/var/run/redis/redis-server.sock", "/run/redis/redis.sock", "/var/run/docker.sock",
                "/run/dbus/system_bus_socket", "/run/systemd/private", "/run/systemd/journal/socket",
                "/run/systemd/notify"]
CONNECT = ("import socket\n"
           "s = socket.socket(socket.AF_UNIX)\n"
           "s.settimeout(2)\n"
           "try:\n"
           "    s.connect({address!r})\n"
           "    print('connected')\n"
           "except OSError as exc:\n"
           "    print('refused', type(exc).__name__)\n")


def connect(address: str | bytes) -> str:
    return CONNECT.format(address=address)


@pytest.fixture
def listening() -> Iterator[tuple[str, bytes]]:
    """A Unix socket any user may connect to (as PostgreSQL's is: 0777 in a world-searchable folder), and an
    abstract one, both listening in the host's namespaces."""
    folder = tempfile.mkdtemp(prefix="agentfly-host-sockets-")
    os.chmod(folder, 0o755)
    path = os.path.join(folder, "service.sock")
    named, abstract = socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)
    named.bind(path)
    os.chmod(path, 0o777)
    name = f"\0agentfly-test-{uuid.uuid4().hex}".encode()
    abstract.bind(name)
    for s in (named, abstract):
        s.listen(8)
    try:
        yield path, name
    finally:
        named.close()
        abstract.close()
        os.unlink(path)
        os.rmdir(folder)


async def test_unconfined_code_does_reach_the_test_sockets(listening: tuple[str, bytes]) -> None:
    # The control: without the sandbox's root and network namespace the same attempt succeeds.
    path, abstract = listening
    async with PythonSandbox(isolation=Isolation(network="host", filesystem="host", own_uid=True)) as box:
        assert await box.run(connect(path)) == "connected\n"
        assert await box.run(connect(abstract)) == "connected\n"


async def test_a_sandbox_cannot_connect_to_any_host_unix_socket(listening: tuple[str, bytes]) -> None:
    path, abstract = listening
    real = [p for p in HOST_SOCKETS if Path(p).is_socket()]
    assert POSTGRES in real, "PostgreSQL listens on its Unix socket on this machine"
    async with PythonSandbox() as box:
        assert "bubblewrap" in box.isolation()["filesystem"]
        for address in [path, abstract, *HOST_SOCKETS]:
            assert (await box.run(connect(address))).startswith("refused"), address
        # Nor through a program: psql is installed and the socket folder is where it looks.
        out = await box.run("import subprocess\n"
                            "r = subprocess.run(['psql', '-h', '/var/run/postgresql', '-U', 'postgres', '-c', "
                            "'select 1'], capture_output=True, text=True)\n"
                            "print(r.returncode, r.stderr)")
        assert not out.startswith("0 ") and "select" not in out.lower(), out


async def test_the_sandbox_root_holds_only_what_sandbox_view_lists(tmp_path: Path) -> None:
    async with PythonSandbox() as box:
        view = sandbox_view(Isolation(), box.workdir or "")
        assert not [p for p in view if p.startswith(("/run", "/var", "/tmp/", "/etc/")) and p != box.workdir
                    and p not in ("/etc/ld.so.cache", "/etc/localtime")]
        for absent in ("/run", "/var/run", "/etc/passwd", "/etc/shadow", "/srv"):
            out = await box.run(f"import os; os.path.exists({absent!r})")
            assert out == "False\n", absent
        assert await box.run("open('mine.txt', 'w').write('ok')") == "2\n"


async def test_without_bubblewrap_untrusted_code_is_refused_with_the_fix_named(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from agentfly.resources.backends.local import SandboxUnavailable

    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it: never run the code unconfined instead
    with pytest.raises(SandboxUnavailable, match=r"apt-get install bubblewrap.*Isolation\(filesystem='host'\)"):
        async with PythonSandbox():
            pass
