"""Try-it children and the sandboxes they start reach no host socket or file beyond their own (issue 28):
PostgreSQL's Unix socket (trusted for local connections on this machine: the critical attack), any other
listening Unix socket or abstract socket, and another team's plugin folder. A team named like a shared
plugin package does not take it over.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse

from tests.webapp.helpers import Worker
from tests.webapp.registry.test_registry_security import PLUGINS, plugin_file, registered, try_it

POSTGRES = "/var/run/postgresql/.s.PGSQL.5432"


@pytest.fixture
def listening() -> Iterator[tuple[str, str]]:
    """A Unix socket any user may connect to (0777 in a world-searchable folder, as PostgreSQL's) and an
    abstract one, listening on the host; ``@name`` names the abstract one."""
    folder = tempfile.mkdtemp(prefix="agentfly-host-sockets-")
    os.chmod(folder, 0o755)
    path, name = os.path.join(folder, "service.sock"), f"agentfly-test-{uuid.uuid4().hex}"
    named, abstract = socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)
    named.bind(path)
    os.chmod(path, 0o777)
    abstract.bind("\0" + name)
    for s in (named, abstract):
        s.listen(8)
    try:
        for address in (path, "\0" + name, POSTGRES):  # each one really answers on the host
            probe = socket.socket(socket.AF_UNIX)
            probe.connect(address)
            probe.close()
        yield path, f"@{name}"
    finally:
        named.close()
        abstract.close()
        os.unlink(path)
        os.rmdir(folder)


def test_try_it_cannot_connect_to_postgresql_or_any_host_socket(
        alice_api: Any, team_a: Any, worker: Worker, transactional_db: None, listening: tuple[str, str]) -> None:
    entry = registered(alice_api, "hostile_tools:connect")
    for address in (POSTGRES, *listening, "/var/run/docker.sock", "/run/dbus/system_bus_socket",
                    "/run/systemd/private", "/var/run/redis/redis-server.sock"):
        result = try_it(alice_api, entry, {"address": address}).json()
        assert result["observation"].startswith("refused"), (address, result)


def test_try_it_python_code_cannot_connect_to_postgresql(
        alice_client: Any, builtins: dict[str, Any], listening: tuple[str, str]) -> None:
    for address in (POSTGRES, listening[0], "\\0" + listening[1][1:]):
        code = ("import socket; s = socket.socket(socket.AF_UNIX); s.settimeout(2)\n"
                f"try:\n    s.connect({address!r}); print('connected')\nexcept OSError as e:\n    print('refused', e)")
        response = alice_client.post(reverse("registry:try", args=[builtins["python_code"].pk]),
                                     {"arguments": json.dumps({"code": code})})
        observation = response.context["result"]["observation"]
        assert observation.startswith("refused"), (address, observation)


def test_try_it_reads_only_its_own_teams_plugin_folder_and_the_shared_ones(
        alice_api: Any, team_a: Any, team_b: Any, worker: Worker, transactional_db: None) -> None:
    with plugin_file("team-a/mine.py", "A = 'team a'\n"), plugin_file("team-b/theirs.py", "B = 'team b secret'\n"):
        entry = registered(alice_api, "hostile_tools:read")
        seen = {name: try_it(alice_api, entry, {"path": str(PLUGINS / name)}).json()["observation"]
                for name in ("team-a/mine.py", "team_tools.py", "team-b/theirs.py")}
        assert seen["team-a/mine.py"] == "read: A = 'team a'\n"
        assert seen["team_tools.py"].startswith("read: ")
        assert seen["team-b/theirs.py"] == "unreadable: FileNotFoundError"
        listing = try_it(alice_api, entry, {"path": str(PLUGINS / "team-b")}).json()["observation"]
        assert listing == "unreadable: FileNotFoundError"


def test_a_team_named_like_a_shared_package_does_not_take_it_over(
        alice_api: Any, team_a: Any, worker: Worker, transactional_db: None) -> None:
    from django.contrib.auth.models import Group

    from webapp.accounts.models import Team
    from webapp.registry.plugins import shared_package_names, team_folders

    tool = "from agentfly.tools import tool\n\n@tool\ndef shout(text: str) -> str:\n    \"\"\"Shout.\"\"\"\n    return text.upper()\n"
    with plugin_file("text_utils/__init__.py", ""), plugin_file("text_utils/loud.py", tool):
        assert "text_utils" in shared_package_names([PLUGINS])
        # A team that exists under the package's name (made before slugs were checked, or in a shell).
        Team.objects.create(group=Group.objects.create(name="text_utils"), slug="text_utils")
        assert team_folders("text_utils", [PLUGINS]) == []
        entry = registered(alice_api, "text_utils.loud:shout")  # still every team's
        assert try_it(alice_api, entry, {"text": "hi"}).json()["observation"] == "HI"
        from webapp.registry.rules import NotRegistrable, check_registrable

        with pytest.raises(NotRegistrable, match="is a shared plugin package"):
            check_registrable("tool", "agentfly_teams.text_utils.loud:shout", "text_utils")


def test_a_child_of_a_builtin_entry_sees_no_team_folder(team_a: Any, team_b: Any) -> None:
    from webapp.registry.child import child_read_paths

    with plugin_file("team-a/mine.py", "A = 1\n"):
        paths = child_read_paths([str(PLUGINS)], None)
        assert str(PLUGINS / "team_tools.py") in paths
        assert not [p for p in paths if Path(p).is_relative_to(PLUGINS / "team-a")]
        assert str(PLUGINS / "team-a") in child_read_paths([str(PLUGINS)], "team-a")


def capability_sets(status: str) -> dict[str, str]:
    return {line.split(":")[0]: line.split()[1] for line in status.splitlines()
            if line.startswith(("CapEff", "CapPrm", "CapBnd"))}


NO_CAPS = {"CapEff": "0" * 16, "CapPrm": "0" * 16, "CapBnd": "0" * 16}


def test_a_try_it_child_and_the_python_code_sandbox_it_starts_hold_no_capability(
        alice_api: Any, alice_client: Any, builtins: dict[str, Any], team_a: Any, worker: Worker,
        transactional_db: None) -> None:
    # The worker runs as root, and the Python installation is below /root (0700): the child still holds no
    # CAP_DAC_READ_SEARCH, nor any other capability, effective, permitted or in its bounding set.
    assert os.geteuid() == 0
    entry = registered(alice_api, "hostile_tools:read")
    observation = try_it(alice_api, entry, {"path": "/proc/self/status"}).json()["observation"]
    assert observation.startswith("read: "), observation
    assert capability_sets(observation) == NO_CAPS
    code = "print(open('/proc/self/status').read())"
    response = alice_client.post(reverse("registry:try", args=[builtins["python_code"].pk]),
                                 {"arguments": json.dumps({"code": code})})
    assert capability_sets(response.context["result"]["observation"]) == NO_CAPS
