"""Who may register which MCP server. Checked at registration (web process), and again on the worker before
the server is started or reached (a row may outlive a setting's change).

- **stdio**: a Python script inside the team's own plugin folder (``AGENTFLY_PLUGIN_DIRS/<team>/``), given as
  its path relative to that folder (``["kv_server.py", "--flag"]``), run with the worker's interpreter; or a
  command the operator allowlisted, argv for argv, in ``AGENTFLY_MCP_COMMANDS``. Nothing else: shells and
  interpreters given code on the command line (``bash -c``, ``python -c``), package runners that download
  what they run (``npx``, ``uvx``, ``pipx``), and paths out of the folder are refused, each with the setting
  that would allow it. The server then runs in the sandbox (no secrets, rlimits, no capability, Landlock) with
  no network unless ``AGENTFLY_MCP_NETWORK`` names it (``team-slug/server-name``), and reads only the Python
  installation, its team's plugin folder and ``AGENTFLY_MCP_READ_PATHS`` (``stdio_read_paths``).
- **HTTP**: the URL is parsed (``agentfly.urls``: userinfo, backslashes and dot segments refused,
  IP literals in any form normalised) and must be on the origin of an entry of ``AGENTFLY_MCP_URLS`` (scheme,
  host and port equal) under its path on a segment boundary; a host that resolves to a loopback, private,
  link-local or other non-public address (an IPv4 address inside an IPv6 one counts as itself) must also be in
  ``AGENTFLY_MCP_LOCAL_HOSTS`` (so an allowlisted name cannot be pointed at the worker's own services). The
  address checked is the address connected to: the worker's client is pinned to it, so a name that resolves
  elsewhere a second later gains nothing. The SDK's client follows a redirect only on the same origin, so a
  redirect off the allowlisted host is refused by the client itself.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from django.conf import settings

from agentfly import urls
from webapp.mcpservers.models import MCPServer, Transport
from webapp.registry.plugins import team_folders

SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "fish", "busybox", "env"}
RUNNERS = {"npx", "npm", "pnpm", "yarn", "bunx", "bun", "uvx", "pipx", "deno", "node", "docker", "curl", "wget"}
MAX_ARGS, MAX_ARG = 32, 500


class NotAllowed(ValueError):
    """The server may not be registered or started; the message names the setting that would allow it."""


def _plugin_dirs() -> list[Path]:
    return [Path(p) for p in settings.AGENTFLY_PLUGIN_DIRS]


def stdio_argv(team_slug: str, command: list[str]) -> list[str]:
    """The argv to start a team's stdio server with; NotAllowed says why not and what to change."""
    if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
        raise NotAllowed("command must be a list of strings, e.g. [\"kv_server.py\"] (a script in your team's "
                         "plugin folder)")
    if len(command) > MAX_ARGS or any(len(a) > MAX_ARG or "\0" in a for a in command):
        raise NotAllowed(f"command has more than {MAX_ARGS} arguments or one longer than {MAX_ARG} characters")
    if command in [list(c) for c in settings.AGENTFLY_MCP_COMMANDS]:
        return list(command)
    fix = ("put the server's script in your team's plugin folder (AGENTFLY_PLUGIN_DIRS/<team>/) and register "
           "its path there, or ask the operator to add this exact argv to AGENTFLY_MCP_COMMANDS")
    program = os.path.basename(command[0])
    if program in SHELLS or program.startswith("python") or program in RUNNERS:
        what = (f"`{program} -c`" if "-c" in command[1:] else f"`{program}`") if program not in RUNNERS else \
            f"`{program} <anything>` (it fetches and runs code)"
        raise NotAllowed(f"{what} is not an MCP server AgentFly may start: {fix}.")
    folders = team_folders(team_slug.replace("-", "_"), _plugin_dirs())
    if len(folders) != 1:
        raise NotAllowed(f"team {team_slug!r} has no plugin folder (AGENTFLY_PLUGIN_DIRS/{team_slug}/): {fix}.")
    folder = folders[0].resolve()
    script = command[0]
    if os.path.isabs(script) or not script.endswith(".py"):
        raise NotAllowed(f"{script!r} is not a .py path relative to your team's plugin folder: {fix}.")
    target = (folder / script).resolve()  # symlinks and .. resolved: the real file must be inside
    if not target.is_relative_to(folder):
        raise NotAllowed(f"{script!r} is outside your team's plugin folder: {fix}.")
    if not target.is_file():
        raise NotAllowed(f"{script!r} does not exist in your team's plugin folder ({folder.name}/)")
    return [sys.executable, str(target), *command[1:]]


def stdio_read_paths(team_slug: str) -> list[str]:
    """What a team's stdio server may read besides the Python installation: its team's plugin folder and the
    operator's ``AGENTFLY_MCP_READ_PATHS``. Never a path its argv names: an argument is a string for the
    server, not a mount (``agentfly.resources.mcp``)."""
    folders = team_folders(team_slug.replace("-", "_"), _plugin_dirs())
    return [*(str(f.resolve()) for f in folders), *(str(Path(p).resolve()) for p in settings.AGENTFLY_MCP_READ_PATHS)]


def check_url(url: str) -> tuple[str, str]:
    """``url`` and the address to connect to for it, if an HTTP server there may be reached; NotAllowed names
    what is wrong and the setting that would allow it otherwise."""
    try:
        endpoint = urls.parse(url)
        allowlist = [urls.parse(entry, what="the AGENTFLY_MCP_URLS entry") for entry in settings.AGENTFLY_MCP_URLS]
    except urls.URLRefused as exc:
        raise NotAllowed(str(exc)) from None
    if not any(endpoint.within(entry) for entry in allowlist):
        raise NotAllowed(f"{url[:200]!r} is not on the operator's allowlist: its scheme, host and port must be "
                         "those of an entry of AGENTFLY_MCP_URLS and its path under that entry's path; ask the "
                         "operator to add it")
    try:
        addresses = urls.resolve(endpoint)
    except urls.URLRefused as exc:
        raise NotAllowed(str(exc)) from None
    internal = [a for a in addresses if urls.is_internal(a)]
    if internal and endpoint.host not in {urls.normal_host(h) for h in settings.AGENTFLY_MCP_LOCAL_HOSTS}:
        raise NotAllowed(f"{endpoint.host!r} resolves to a loopback, private or link-local address "
                         f"({', '.join(internal)}); only hosts in AGENTFLY_MCP_LOCAL_HOSTS may")
    return url, addresses[0]


def network_allowed(team_slug: str, name: str) -> bool:
    return f"{team_slug}/{name}" in settings.AGENTFLY_MCP_NETWORK


def allowed_launch(server: MCPServer) -> dict[str, Any]:
    """How a registered server may be started or reached, checked against the rule now: ``command`` and
    ``network`` for stdio, ``url`` and the checked ``address`` to connect to for HTTP (``agentfly.mcp.server``'s
    and ``mcp.<name>``'s keys)."""
    slug = server.team.slug
    if server.transport == Transport.STDIO:
        return {"command": stdio_argv(slug, list(server.command)), "read_paths": stdio_read_paths(slug),
                "network": "host" if network_allowed(slug, server.name) else "none"}
    url, address = check_url(server.url)
    return {"url": url, "address": address}
