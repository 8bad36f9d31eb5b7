"""One command of a workspace, run inside its bubblewrap root: harden, then become bash (or read/write a file).

Run as a script (``python -I _shell.py MODE``) by ``agentfly.resources.workspace``; it imports nothing but the
standard library and ``_worker`` beside it (whose ``harden`` applies the same isolation as every sandbox:
limits, a private uid, Landlock). Modes:

- ``bash``: ``cd $AF_CWD``, run ``$AF_CMD`` with ``eval``, and on exit print ``$AF_MARK`` and the shell's working
  directory as the last line, so the workspace keeps the directory across calls without a resident shell.
- ``write PATH``: stdin's bytes into PATH (parents made), relative to ``$AF_CWD``.
- ``read PATH``: PATH's bytes to stdout, at most ``$AF_LIMIT`` of them, then a JSON line with the size.

The umask is 0: the forks of a workspace run under uids of their own and must write the files their parent
made; nothing outside this bubblewrap root sees the workspace, so wider modes expose nothing.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _worker import die_with_parent, harden  # beside this file, on the path just above

BASH = (
    'trap \'printf "\\n%s%s" "$AF_MARK" "$PWD"\' EXIT\n'
    'cd -- "$AF_CWD" 2>/dev/null || cd /workspace\n'
    'eval "$AF_CMD"\n'
)


def read_identity() -> int | None:
    """The private uid the parent names on stdin's first line (read byte by byte: the rest is the command's)."""
    line = b""
    while not line.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte:
            break
        line += byte
    uid = json.loads(line or b"{}").get("uid")
    return uid if isinstance(uid, int) and uid >= 100000 else None


def main() -> None:
    config = json.loads(os.environ.pop("AGENTFLY_SANDBOX", "{}"))
    config["parent_pid"] = os.getppid()  # bubblewrap's init: die with it
    die_with_parent(config["parent_pid"])
    config["uid"] = read_identity()
    try:
        harden(config)
    except Exception as exc:  # never run a command half-isolated
        sys.stderr.write(f"agentfly: isolation failed: {type(exc).__name__}: {exc}\n")
        os._exit(126)
    os.umask(0)
    mode = sys.argv[1] if len(sys.argv) > 1 else "bash"
    cwd = os.environ.get("AF_CWD") or "/workspace"
    if mode == "bash":
        os.execv("/bin/bash", ["bash", "--noprofile", "--norc", "-c", BASH])
    path = os.path.join(cwd, sys.argv[2])
    if mode == "write":
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "wb") as f:
            f.write(sys.stdin.buffer.read())
        return
    if mode == "read":
        limit = int(os.environ.get("AF_LIMIT", "65536"))
        with open(path, "rb") as f:
            data = f.read(limit + 1)
            size = os.fstat(f.fileno()).st_size
        sys.stdout.buffer.write(data[:limit])
        sys.stdout.buffer.write(b"\n" + json.dumps({"size": size}).encode())
        return
    sys.stderr.write(f"agentfly: unknown mode {mode!r}\n")
    os._exit(2)


if __name__ == "__main__":
    main()
