"""The coding workspace on the docker backend: git, pytest and POSIX programs in a container as nobody with no
network, a shell whose directory persists, bounded commands that leave nothing running, forks that are the
engine's copy-on-write layers and share nothing they write, no container or image left behind, a container
lost from outside typed as the infrastructure's failure, and a code-repair job whose groups fork one docker
workspace. Runs where a docker engine answers and has the workspace image (``AGENTFLY_WORKSPACE_IMAGE``,
built from ``deploy/workspace.Dockerfile``); CI's stack step (scripts/stack_test.sh) builds it and runs them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agentfly.resources import InfrastructureFailure, Pool
from agentfly.resources.sandbox import docker_available
from agentfly.resources.workspace import DEFAULT_WORKSPACE_IMAGE, DockerWorkspace, Workspace
from agentfly.tools.builtin.workspace import WORKSPACE
from tests.integration.resources.test_workspace import PROJECT, edits_stay_in_their_fork


def _skip_reason() -> str | None:
    reason = docker_available()
    if reason:
        return reason
    import docker

    try:
        docker.from_env().images.get(DEFAULT_WORKSPACE_IMAGE)
    except Exception:
        return (f"the image {DEFAULT_WORKSPACE_IMAGE} is not built (docker build -t {DEFAULT_WORKSPACE_IMAGE} "
                "-f deploy/workspace.Dockerfile deploy)")
    return None


REASON = _skip_reason()
pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.skipif(REASON is not None, reason=str(REASON))]

# The workspace pool on docker: what a job names as resources.workspace.spec to run its workspaces there.
DOCKER_WORKSPACE = WORKSPACE.replace(backend="docker", pool=Pool(0, 4))


def _ours() -> tuple[set[str], set[str]]:
    """The ids of the sandbox containers and of the workspaces' fork images on the engine."""
    import docker

    client = docker.from_env()
    containers = {c.id for c in client.containers.list(all=True, filters={"label": "agentfly.sandbox=1"})}
    images = {i.id for i in client.images.list(name="agentfly-workspace-fork")}
    return containers, images


async def test_git_pytest_and_posix_programs_work_in_a_docker_workspace_as_nobody_with_no_network() -> None:
    async with Workspace(backend="docker") as ws:
        assert isinstance(ws, DockerWorkspace)
        await ws.prepare(PROJECT)
        log = await ws.sh("git log --oneline && git status --porcelain && echo quiet > /dev/null && echo t > /tmp/t && "
                          "cat /tmp/t >/dev/null && echo ok")
        assert log.ok and "the task as given" in log.text and log.text.endswith("ok\n"), log
        tests = await ws.run_tests()
        assert tests.exit_code == 1 and "1 failed, 1 passed" in tests.text, tests.text
        sub = await ws.sh("python -c 'import subprocess; print(subprocess.run([\"git\", \"status\"], "
                          "stdout=subprocess.DEVNULL).returncode)'")
        assert sub.text.strip() == "0", sub
        await ws.write_file("calc.py", "def add(a, b):\n    return a + b\n")
        assert "2 passed" in (await ws.run_tests()).text
        assert "+    return a + b" in await ws.diff()
        assert (await ws.read_file("tests/test_calc.py")).startswith("from calc import add")
        with pytest.raises(FileNotFoundError, match=r"nope\.py"):
            await ws.read_file("nope.py")
        patched = await ws.apply_patch("--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n-def add(a, b):\n+def add(x, y):\n"
                                       "     return a + b\n")
        assert patched.ok and "def add(x, y)" in await ws.read_file("calc.py"), patched
        # No network, nobody, no capabilities, and nothing of the image's own files to change.
        closed = await ws.sh("python -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), timeout=2)'")
        assert not closed.ok and ("unreachable" in closed.text or "Network" in closed.text), closed
        who = await ws.sh("id -u; grep CapEff /proc/self/status; touch /usr/bin/x 2>&1; touch /etc/x 2>&1")
        lines = who.text.splitlines()
        assert lines[0] == "65534" and lines[1].split()[1] == "0000000000000000", who.text
        assert who.text.count("Permission denied") == 2, who.text
        assert ws.isolation()["network"] == "none (container)"
        # PID 1 keeps the container, under a uid of its own: a command can neither signal it nor read it, so
        # the code inside cannot end its container and pass that off as the infrastructure's failure.
        keeper = await ws.sh("kill -9 1; kill -TERM 1; cat /proc/1/environ; echo after")
        assert keeper.text.count("Operation not permitted") == 2 and "Permission denied" in keeper.text, keeper.text
        assert keeper.text.endswith("after\n") and await ws.health()


async def test_a_docker_workspaces_shell_keeps_its_directory_and_a_long_command_is_killed_with_what_it_started() -> None:
    async with Workspace(backend="docker", timeout=2) as ws:
        await ws.prepare(PROJECT)
        assert (await ws.sh("cd tests")).cwd == "/workspace/tests"
        assert (await ws.sh("ls")).text.split() == ["test_calc.py"]
        slow = await ws.sh("(sleep 60 &) ; sleep 60")
        assert slow.timed_out and slow.exit_code is None and "time limit" in slow.observation()
        quick = await ws.sh("(sleep 30 &) ; echo started")
        assert quick.ok and quick.text.strip() == "started"
        left = await ws.sh("ps -eo comm= | sort | uniq -c")
        assert "sleep" not in left.text, left.text  # neither the timed-out command's nor the background one
        loud = await ws.sh("yes | head -c 200000")
        assert loud.truncated > 150_000 and len(loud.text) < 20_000
        assert (await ws.sh("pwd")).text.strip() == "/workspace/tests"
        # The per-process limits: a CPU-bound loop dies at its CPU seconds, the container stays.
        ws.limits = ws._box.limits = type(ws.limits)(cpu_seconds=1, processes=64)
        spin = await ws.sh("python -c 'while True: pass'", timeout=20)
        assert spin.exit_code not in (0, None) and await ws.health(), spin


async def test_an_edit_in_one_docker_fork_is_seen_in_no_other_fork_nor_in_the_parent() -> None:
    async with Workspace(backend="docker") as parent:
        await edits_stay_in_their_fork(parent)


@pytest.mark.timeout(600)
async def test_64_docker_forks_leave_no_container_or_image_after_they_close() -> None:
    before = _ours()
    root = Workspace(backend="docker")
    kids: list[Workspace] = []
    grandkids: list[Workspace] = []
    try:
        await root.start()
        await root.prepare(PROJECT)
        kids = await root.fork(64)
        results = await asyncio.gather(*(k.sh(f"(sleep 30 &); echo {i} > mine.txt; cat mine.txt")
                                         for i, k in enumerate(kids)))
        assert [r.text.strip() for r in results] == [str(i) for i in range(64)]
        grandkids = await kids[5].fork(2)
        assert (await grandkids[1].read_file("mine.txt")) == "5\n"
        containers, images = _ours()
        assert len(containers - before[0]) == 1 + 64 + 2 and len(images - before[1]) == 2
        for w in (*kids, *grandkids):
            await w.close()
        assert (await root.sh("ls mine.txt 2>&1")).exit_code != 0
        assert len(_ours()[1] - before[1]) == 2  # the parent still stands on the images' lineage
    finally:
        for w in (*kids, *grandkids, root):
            await w.close()
    assert _ours() == before


async def test_a_groups_commands_on_docker_forks_run_at_once_not_queued_behind_each_other() -> None:
    async with Workspace(backend="docker") as parent:
        await parent.prepare(PROJECT)
        kids = await parent.fork(12)  # twice the event loop's default threads on two cores
        try:
            spans = await asyncio.gather(*(k.sh("date +%s.%N; sleep 3; date +%s.%N") for k in kids))
            starts, ends = zip(*((float(a), float(b)) for a, b in (s.text.split() for s in spans)), strict=True)
            assert max(starts) < min(ends), spans  # every command was running at one moment
        finally:
            for kid in kids:
                await kid.close()


async def test_a_docker_workspace_whose_container_is_removed_from_outside_fails_as_infrastructure() -> None:
    import docker

    async with Workspace(backend="docker", timeout=30) as ws:
        await ws.prepare(PROJECT)
        running = asyncio.ensure_future(ws.sh("sleep 20"))
        await asyncio.sleep(1.5)
        docker.from_env().containers.get(ws._box.container.id).remove(force=True)
        with pytest.raises(InfrastructureFailure) as failed:
            await asyncio.wait_for(running, 15)
        assert failed.value.kind == "killed", failed.value
        assert not await ws.health()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_code_repair_job_from_yaml_forks_one_docker_workspace_per_group(tiny_model_dir: Path, tmp_path: Path) -> None:
    from trainer.config import load_config
    from trainer.events import CallbackSink
    from trainer.loop import Trainer

    root = Path(__file__).resolve().parents[3]
    before = _ours()
    config = load_config(root / "examples/code_repair/grpo.yaml", [
        f"model.path={tiny_model_dir}", f"output_dir={tmp_path}", "steps=1", "threads=1", "update_threads=1",
        "progress=false", "max_minutes=null", "save_every=0", "data.train_size=16", "data.eval_size=2",
        "rollout.prompts_per_step=2", "rollout.group_size=3", "rollout.max_new_tokens=24", "rollout.max_turns=2",
        "eval.every=0", "eval.max_new_tokens=16", "log_samples=-1",
        f"resources.workspace.spec={__name__}:DOCKER_WORKSPACE",
    ])
    events: list[dict[str, Any]] = []
    Trainer(config, sinks=[CallbackSink(events.append)]).train()
    trajectories = [t for e in events if e["type"] == "samples" for t in e["data"]["trajectories"]]
    assert len(trajectories) == 6 and all(t["failure"] is None for t in trajectories), trajectories
    for t in trajectories:  # each rollout's fork held its group's project, and its tests ran in the container
        assert t["reward"] == pytest.approx(t["sample"]["baseline"]) and "passed" in t["artifacts"]["tests"]
    pools = [e["data"]["pools"]["workspace"] for e in events if e["type"] == "resources"
             and "workspace" in e["data"]["pools"]]
    assert pools and pools[-1]["acquires"] == 2 and pools[-1]["isolation"]["forks"].startswith("docker commit")
    assert _ours() == before
