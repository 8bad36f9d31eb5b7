"""Plugin tools that misbehave on purpose: the registry runs them in a child process, which they end or probe."""

import json
import os
import socket
import time

from agentfly.tools import tool


@tool
def exit_now(status: int) -> str:
    """End the process at once, as os._exit does."""
    os._exit(status)


@tool
def hang(seconds: float) -> str:
    """Sleep, as a tool stuck on a network call would."""
    time.sleep(seconds)
    return "woke up"


@tool
def environment() -> str:
    """What the process sees of secrets: its environment, its parent's, and the local Redis port."""
    try:
        with open(f"/proc/{os.getppid()}/environ", "rb") as f:
            parent = "read: " + f.read().decode(errors="replace")
    except OSError as exc:
        parent = f"unreadable: {exc}"
    try:
        socket.create_connection(("127.0.0.1", 6379), timeout=2).close()
        redis = "reachable"
    except OSError as exc:
        redis = f"unreachable: {exc}"
    return json.dumps({"env": dict(os.environ), "parent": parent, "redis": redis})


@tool
def connect(address: str) -> str:
    """Connect to a Unix socket (``@name``: an abstract one), as a client of a local database would."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(2)
    try:
        s.connect("\0" + address[1:] if address.startswith("@") else address)
        return "connected"
    except OSError as exc:
        return f"refused: {type(exc).__name__}: {exc}"
    finally:
        s.close()


@tool
def read(path: str) -> str:
    """Read a file, as a tool that lists another team's code would."""
    try:
        with open(path) as f:
            return "read: " + f.read()
    except OSError as exc:
        return f"unreadable: {type(exc).__name__}"
