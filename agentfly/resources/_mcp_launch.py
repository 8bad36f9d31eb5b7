"""Start a stdio MCP server inside the sandbox of the local backend: harden this process, then become the server.

Run by ``LocalWorker`` as ``python -I _mcp_launch.py -- <server argv>``, so the server gets exactly what a
sandbox gets (the environment without secrets, the working directory, and whatever ``LocalWorker.start``
adds). This file applies the same ``harden`` step the sandbox worker applies to itself (rlimits, no network,
a private uid, Landlock), says it is ready on the protocol channel as the worker does, and ``exec``s the
server: limits, the network namespace, the uid and the Landlock domain all survive ``exec``, and
``no_new_privs`` keeps a setuid binary from shedding them. From then on stdin/stdout carry MCP's JSON-RPC.

Standard library only: it runs before anything is importable from the project.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path


def run_python(args: list[str]) -> None:
    """``python [-I|-u|-B ...] script.py ARGS`` or ``python -m module ARGS``, as the interpreter would run it."""
    import runpy

    while args and args[0] in ("-I", "-u", "-B", "-E", "-s"):
        args = args[1:]
    if args[:1] == ["-m"] and len(args) > 1:
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    elif args:
        sys.argv = list(args)
        sys.path.insert(0, os.path.dirname(os.path.realpath(args[0])))
        runpy.run_path(args[0], run_name="__main__")
    else:
        raise SystemExit("no Python server script given")


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    config = json.loads(os.environ.pop("AGENTFLY_SANDBOX", "{}"))

    def reply(message: dict[str, object]) -> None:
        os.write(1, json.dumps(message).encode() + b"\n")

    spec = importlib.util.spec_from_file_location("_agentfly_worker", Path(__file__).parent / "backends" / "_worker.py")
    assert spec is not None and spec.loader is not None
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    worker.die_with_parent(config.get("parent_pid"))
    if config.get("launcher") == "bwrap":
        # As the sandbox worker does (``receive_identity``): under bubblewrap this process is pid 1 of its own
        # process namespace, so the parent names the private uid on stdin's first line. Without it every server
        # became uid 100002, so one sandbox's cleanup (which kills its uid's processes) killed every other
        # server, and RLIMIT_NPROC counted them all together. Read byte by byte: the rest of stdin is MCP's.
        config["parent_pid"] = os.getppid()
        worker.die_with_parent(config["parent_pid"])
        line = b""
        while not line.endswith(b"\n"):
            chunk = os.read(0, 1)
            if not chunk:
                break
            line += chunk
        try:
            uid = json.loads(line or b"{}").get("uid")
        except ValueError:
            uid = None
        if not (isinstance(uid, int) and uid >= 100000):
            reply({"ok": False, "ready": False, "error": f"no private uid from the parent (got {line[:80]!r})"})
            return
        config["uid"] = uid
    os.chdir(config.get("workdir") or os.getcwd())

    if not argv:
        reply({"ok": False, "ready": False, "error": "no server command given"})
        return
    executable = shutil.which(argv[0]) or argv[0]
    python = os.path.realpath(executable) == os.path.realpath(sys.executable)
    try:
        report = worker.harden(config)
    except Exception as exc:  # never run the server half-isolated
        reply({"ok": False, "ready": False, "error": f"isolation failed: {type(exc).__name__}: {exc}"})
        return
    if python:
        # A Python server runs in this interpreter (already hardened, holding no capability): one interpreter
        # start instead of two.
        reply({"ok": True, "ready": True, "pid": os.getpid(), "isolation": report})
        run_python(argv[1:])
        return
    if not os.access(executable, os.X_OK):
        reply({"ok": False, "ready": False, "error": f"the server command {argv[0]!r} cannot be run inside the "
               "sandbox (not found, or not on a path it may read: add its folder to read_paths)"})
        return
    reply({"ok": True, "ready": True, "pid": os.getpid(), "isolation": report})
    os.execv(executable, argv)


if __name__ == "__main__":
    main()
