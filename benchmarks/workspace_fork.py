"""Workspace forks: latency and bytes per copy of ``fork(n)`` against preparing n fresh workspaces, at 8 and 64.

    python benchmarks/workspace_fork.py                   # 8 and 64 copies of a generated code-repair project
    python benchmarks/workspace_fork.py --copies 8 --repeats 5
    python benchmarks/workspace_fork.py --backend docker  # a container per workspace, forks by docker commit

Preparing a workspace is what a GRPO group would do per rollout without forks: start it, write the task's
project, make it a git repository (``git init``, ``add``, ``commit``: one sandboxed command). Forking is what a
group does with them: prepare one, then ``fork(n)``. Both are timed until every copy is usable, and each copy
then runs the same command (``git status``), to show a fork answers as a fresh one does. Bytes per copy are
the disk blocks of what each copy holds on its own (a fresh one: its project and repository; a fork: its empty
upper folders), measured with ``st_blocks``; on docker, what the engine counts as each container's own writes
(``SizeRw``) plus, for forks, an equal share of the image the fork committed. The last line is the ratio of the preparation's time to the
fork's at the largest count (target: at least 10x).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path


def disk_bytes(paths: list[Path]) -> int:
    """Bytes of disk blocks below ``paths`` (not following links)."""
    total = 0
    for root in paths:
        for folder, _dirs, files in os.walk(root):
            for name in [folder, *(os.path.join(folder, f) for f in files)]:
                try:
                    total += os.lstat(name).st_blocks * 512
                except OSError:
                    continue
    return total


def container_bytes(workspaces: list, image: str | None = None) -> int:
    """Bytes the docker engine holds for these workspaces' containers alone, and the fork image if named."""
    import docker

    api = docker.from_env().api
    ids = {w._box.container.id for w in workspaces}
    listed = api.containers(all=True, size=True, filters={"label": "agentfly.sandbox=1"})
    total = sum(c.get("SizeRw") or 0 for c in listed if c["Id"] in ids)
    if image is not None:
        total += api.history(image)[0]["Size"]
    return total


async def measure(n: int, files: dict[str, str], backend: str) -> dict[str, float]:
    from agentfly.resources.workspace import Workspace

    async def fresh() -> Workspace:
        ws = Workspace(backend=backend)
        await ws.start()
        await ws.prepare(files)
        return ws

    opened: list[Workspace] = []  # closed however the measurement ends: a docker workspace is a container
    try:
        start = time.perf_counter()
        fresh_ones = await asyncio.gather(*(fresh() for _ in range(n)))
        opened += fresh_ones
        prepare_s = time.perf_counter() - start
        if backend == "docker":
            fresh_bytes = container_bytes(fresh_ones) / n
        else:
            fresh_bytes = disk_bytes([w.folder for w in fresh_ones if w.folder]) / n
        start = time.perf_counter()
        await asyncio.gather(*(w.sh("git status --short") for w in fresh_ones))
        fresh_cmd_s = time.perf_counter() - start

        parent = await fresh()
        opened.append(parent)
        start = time.perf_counter()
        forks = await parent.fork(n)
        opened += forks
        fork_s = time.perf_counter() - start
        if backend == "docker":
            fork_bytes = container_bytes(forks, parent._family.images[-1]) / n
        else:
            fork_bytes = disk_bytes([p for w in forks for p in (w._upper, w._work, w._mount) if p is not None]) / n
        start = time.perf_counter()
        await asyncio.gather(*(w.sh("git status --short") for w in forks))
        fork_cmd_s = time.perf_counter() - start
    finally:
        for w in opened:
            await w.close()
    return {"prepare_s": prepare_s, "fork_s": fork_s, "fresh_bytes": fresh_bytes, "fork_bytes": fork_bytes,
            "fresh_cmd_s": fresh_cmd_s, "fork_cmd_s": fork_cmd_s}


def main(argv: list[str] | None = None) -> float:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--copies", type=int, nargs="+", default=[8, 64], help="copies per measurement")
    ap.add_argument("--repeats", type=int, default=2, help="runs per count; the median counts")
    ap.add_argument("--backend", choices=["local", "docker"], default="local",
                    help="local: bubblewrap roots (forks: overlays); docker: containers of the workspace image")
    args = ap.parse_args(argv)
    from agentfly.resources.workspace import overlay_available
    from agentfly.tasks.code_repair import generate

    files = generate(1, 0, "test")[0]["files"]
    how = ("docker commit" if args.backend == "docker" else
           "overlay" if overlay_available() is None else "copy: " + str(overlay_available()))
    print(f"project: {len(files)} files, {sum(len(t) for t in files.values())} bytes; forks by {how}")
    print(f"{'copies':>6} | {'prepare n (s)':>13} | {'fork(n) (s)':>11} | {'faster':>7} | {'KiB/copy fresh':>14} | "
          f"{'KiB/copy fork':>13} | {'1st cmd fresh/fork (s)':>22}")
    ratio = 0.0
    for n in args.copies:
        runs = [asyncio.run(measure(n, files, args.backend)) for _ in range(args.repeats)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        ratio = med["prepare_s"] / med["fork_s"]
        print(f"{n:>6} | {med['prepare_s']:>13.3f} | {med['fork_s']:>11.4f} | {ratio:>6.0f}x | "
              f"{med['fresh_bytes'] / 1024:>14.1f} | {med['fork_bytes'] / 1024:>13.1f} | "
              f"{med['fresh_cmd_s']:>10.3f} / {med['fork_cmd_s']:.3f}")
    print(f"fork({args.copies[-1]}) against preparing {args.copies[-1]} fresh workspaces: {ratio:.0f}x faster")
    return ratio


if __name__ == "__main__":
    main()
