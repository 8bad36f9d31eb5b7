"""Plugin tools that misbehave on purpose: the registry runs them in a child process, which they end or probe."""

import json
import os
import socket
import time


def exit_now(status: int) -> str:
    """End the process at once, as os._exit does."""
    os._exit(status)


def hang(seconds: float) -> str:
    """Sleep, as a tool stuck on a network call would."""
    time.sleep(seconds)
    return "woke up"


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
