"""PythonSandbox on the local backend: real child processes, real limits, real attacks.

Each attack must fail inside the sandbox and come back as a clear observation, and the host must not
notice. Tests that depend on a kernel feature (network namespaces, Landlock) skip with the reason the
sandbox itself reported when the feature is missing.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest

from agentfly.context import RolloutContext
from agentfly.resources import (
    InfrastructureFailure,
    Limits,
    Pool,
    PythonSandbox,
    ResourceEngine,
    ResourceSpec,
)
from agentfly.tools.builtin.python_code import python_code


@pytest.fixture
async def box() -> AsyncIterator[PythonSandbox]:
    sandbox = PythonSandbox(timeout=10)
    await sandbox.start()
    yield sandbox
    await sandbox.close()


def live_processes_of(uid: int) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["uids", "status"])
            if p.info["uids"] and p.info["uids"].real == uid and p.info["status"] != psutil.STATUS_ZOMBIE]


async def test_variables_persist_between_calls_like_a_notebook(box: PythonSandbox) -> None:
    assert await box.run("x = 6 * 7") == ""
    assert await box.run("print('x is', x)\nx + 1") == "x is 42\n43\n"


async def test_an_exception_comes_back_as_the_users_traceback_only(box: PythonSandbox) -> None:
    out = await box.run("def f():\n    return 1 / 0\nf()")
    assert "ZeroDivisionError: division by zero" in out
    assert "_worker.py" not in out  # the worker's own frames are hidden


async def test_long_output_is_truncated_with_a_marker() -> None:
    async with PythonSandbox(max_output=100) as box:
        out = await box.run("print('a' * 5000)")
    assert out.startswith("a" * 100)
    assert "[output truncated: 4901 more bytes]" in out


async def test_printing_to_raw_stdout_or_reading_stdin_cannot_break_the_protocol(box: PythonSandbox) -> None:
    out = await box.run('import os, sys\nos.write(1, b\'{"ok": false}\\n\')\nprint(repr(sys.stdin.read()))')
    assert out == '{"ok": false}\n\'\'\n'
    assert await box.run("1 + 1") == "2\n"


async def test_code_cannot_read_files_outside_its_directory(box: PythonSandbox) -> None:
    if not box.isolation()["filesystem"].startswith("landlock"):
        pytest.skip(f"filesystem isolation not in effect here: {box.isolation()['filesystem']}")
    for path in ("/etc/passwd", str(Path(__file__).resolve()), os.path.expanduser("~/.bashrc"), "/proc/1/environ"):
        out = await box.run(f"open({path!r}).read()")
        assert "PermissionError" in out or "FileNotFoundError" in out, (path, out)
    assert "PermissionError" in await box.run("import os; os.listdir('/')")
    assert await box.run("open('mine.txt', 'w').write('ok'); open('mine.txt').read()") == "'ok'\n"


async def test_code_can_read_the_files_it_was_given() -> None:
    async with PythonSandbox(files={"data/input.csv": "a,b\n1,2\n"}) as box:
        assert await box.run("open('data/input.csv').read().splitlines()[1]") == "'1,2'\n"
        await box.reset()  # given files come back after a reset
        assert await box.run("import os; sorted(os.listdir('data'))") == "['input.csv']\n"


async def test_code_cannot_open_a_network_connection(box: PythonSandbox) -> None:
    if not box.isolation()["network"].startswith("namespace"):
        pytest.skip(f"network isolation not in effect here: {box.isolation()['network']}")
    out = await box.run(
        "import socket\ns = socket.socket()\ns.settimeout(2)\ns.connect(('1.1.1.1', 80))", timeout=5
    )
    assert "OSError" in out and "unreachable" in out


async def test_a_fork_bomb_hits_the_process_limit_and_leaves_nothing_behind(box: PythonSandbox) -> None:
    if box.worker.uid is None:
        pytest.skip("no private uid (not root): RLIMIT_NPROC would count this user's other processes")
    uid = box.worker.uid
    bomb = textwrap.dedent("""
        import os, time
        n = 0
        try:
            while True:
                if os.fork() == 0:
                    time.sleep(120)
                    os._exit(0)
                n += 1
        except OSError as exc:
            print('stopped after', n, 'forks:', exc)
    """)
    out = await box.run(bomb, timeout=10)
    assert "stopped after" in out and "Resource temporarily unavailable" in out
    assert len(live_processes_of(uid)) <= Limits().processes
    await box.reset()
    assert [p.pid for p in live_processes_of(uid)] == [box.pid]
    assert await box.run("'still alive'") == "'still alive'\n"


async def test_exhausting_memory_raises_memory_error_inside_and_the_host_does_not_notice() -> None:
    async with PythonSandbox(limits=Limits(memory_bytes=256 << 20), timeout=60) as box:
        out = await box.run("blocks = [bytearray(16 << 20) for _ in range(256)]")  # 4 GiB against 256 MiB
        assert "MemoryError" in out
        assert await box.run("'still alive'") == "'still alive'\n"


async def test_an_endless_loop_is_killed_at_its_timeout_and_the_sandbox_restarts(box: PythonSandbox) -> None:
    await box.run("x = 1")
    old_pid, restarts = box.pid, box.restarts
    out = await box.run("while True:\n    pass", timeout=0.5)
    assert box.restarts == restarts + 1 and box.pid != old_pid  # killed at its timeout, replaced once
    assert out.startswith("Error: execution timed out after 0.5 s") and "restarted" in out
    assert not psutil.pid_exists(old_pid) or psutil.Process(old_pid).status() == psutil.STATUS_ZOMBIE
    assert "NameError" in await box.run("x")  # a fresh interpreter: the old state is gone, as it said


async def test_a_crashed_interpreter_is_restarted_with_an_observation_that_says_so(box: PythonSandbox) -> None:
    out = await box.run("import ctypes\nctypes.string_at(0)")
    assert out.startswith("Error: sandbox process exited (killed by SIGSEGV")
    assert await box.run("2 + 2") == "4\n"


async def test_an_interpreter_sigkilled_from_outside_is_restarted_and_reported_as_an_infrastructure_failure(
        box: PythonSandbox) -> None:
    # A SIGKILL is what the host's OOM killer, an operator or a node shutting down sends; the sandbox's own
    # limits end it otherwise (SIGXCPU), so the rollout is not the agent's failure. Code that SIGKILLs its
    # own interpreter looks the same from outside, and is left out of training rather than trained on.
    asyncio.get_running_loop().call_later(0.3, os.kill, box.pid, signal.SIGKILL)
    with pytest.raises(InfrastructureFailure) as failure:
        await box.run("import time; time.sleep(10)")
    assert failure.value.kind == "killed"
    assert await box.run("2 + 2") == "4\n"


async def test_reset_clears_variables_files_environment_and_leftover_processes(box: PythonSandbox) -> None:
    await box.run("import os, subprocess\nsecret = 1\nopen('f.txt', 'w').write('x')\nos.environ['K'] = 'v'\n"
                  "p = subprocess.Popen(['sleep', '60'], start_new_session=True)")
    await box.reset()
    assert "NameError" in await box.run("secret")
    assert await box.run("import os; (os.listdir('.'), os.environ.get('K'))") == "([], None)\n"
    if box.worker.uid is not None:
        assert [p.pid for p in live_processes_of(box.worker.uid)] == [box.pid]


async def test_a_sandbox_with_a_leftover_thread_refuses_to_reset(box: PythonSandbox) -> None:
    await box.run("import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()")
    with pytest.raises(Exception, match="leftover thread"):
        await box.reset()


async def test_the_python_code_tool_keeps_one_sandbox_per_rollout_and_reports_isolation_in_stats() -> None:
    spec = ResourceSpec(name="python", factory=PythonSandbox, kind="sandbox", pool=Pool(min=1, max=2),
                        acquire_timeout=30)
    async with ResourceEngine([spec]) as engine:
        a = RolloutContext(sample={}, rollout_id="a", group_id="g", resources=engine)
        b = RolloutContext(sample={}, rollout_id="b", group_id="g", resources=engine)
        assert (await python_code.invoke({"code": "v = 'a'"}, context=a)).observation == "(no output)"
        await python_code.invoke({"code": "v = 'b'"}, context=b)
        assert (await python_code.invoke({"code": "v"}, context=a)).observation == "'a'\n"
        assert (await python_code.invoke({"code": "v"}, context=b)).observation == "'b'\n"
        await a.aclose()
        await b.aclose()
        await engine.settle()
        stats = engine.stats()["python"]
        assert stats["in_use"] == 0 and stats["idle"] == 2
        assert "network_isolated" in stats and "network" in stats["isolation"]
        c = RolloutContext(sample={}, rollout_id="c", group_id="g", resources=engine)
        assert "NameError" in (await python_code.invoke({"code": "v"}, context=c)).observation
        await c.aclose()


SCRIPT = """
import asyncio, sys
from agentfly.resources import Pool, PythonSandbox, ResourceEngine, ResourceSpec

async def main():
    engine = ResourceEngine([ResourceSpec(name="python", factory=PythonSandbox, pool=Pool(min=2, max=2))])
    await engine.start()
    print(" ".join(str(s.resource.pid) for s in engine.pools["python"].instances), flush=True)
    if sys.argv[1] == "wait":
        await asyncio.sleep(60)

asyncio.run(main())
"""


@pytest.mark.parametrize("ending", ["sigterm", "exit"])
def test_sandboxes_die_with_the_job_on_sigterm_and_at_interpreter_exit(ending: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, "wait" if ending == "sigterm" else "exit"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2
    if ending == "sigterm":
        proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) in (0, -signal.SIGTERM)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(psutil.pid_exists(p) for p in pids):
        time.sleep(0.05)
    survivors = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert survivors == []


async def test_closing_a_sandbox_mid_call_leaves_no_process() -> None:
    box = PythonSandbox()
    await box.start()
    call = asyncio.create_task(box.run("import time; time.sleep(30)", timeout=60))
    await asyncio.sleep(0.2)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    pid = box.pid
    await box.close()
    assert pid is not None and pid not in [c.pid for c in psutil.Process().children(recursive=True)]


def test_a_synchronous_close_after_the_loop_ended_kills_every_sandbox() -> None:
    engine = ResourceEngine([ResourceSpec(name="python", factory=PythonSandbox, pool=Pool(min=2, max=2))])

    async def use() -> list[int]:
        await engine.start()
        lease = await engine.acquire("python")
        await lease.instance.run("x = 1")
        return [s.resource.pid for s in engine.pools["python"].instances]

    pids = asyncio.run(use())  # the lease is never released, the engine never closed inside the loop
    assert all(psutil.pid_exists(p) for p in pids)
    engine.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_a_sandbox_killed_while_idle_is_replaced_by_the_health_check() -> None:
    spec = ResourceSpec(name="python", factory=PythonSandbox, pool=Pool(min=1, max=1), health_interval=0)
    async with ResourceEngine([spec]) as engine:
        victim = next(iter(engine.pools["python"].instances)).resource
        os.kill(victim.pid, signal.SIGKILL)
        lease = await engine.acquire("python", timeout=30)
        assert lease.instance is not victim
        assert await lease.instance.run("'fresh'") == "'fresh'\n"
        stats = engine.stats()["python"]
        assert (stats["failed"], stats["created"], stats["destroyed"]) == (1, 2, 1)
        assert "failed its health check" in stats["last_error"]
        await engine.release(lease)


async def test_a_worker_that_dies_at_start_is_a_clear_error_and_leaves_nothing() -> None:
    from agentfly.resources import ResourceError
    from agentfly.resources.backends import LocalWorker

    worker = LocalWorker([sys.executable, "-c", "import sys; sys.exit(3)"])
    with pytest.raises(ResourceError, match=r"sandbox process exited \(exit code 3\)"):
        await worker.start()
    assert worker.workdir is not None and not os.path.exists(worker.workdir)


async def test_code_that_writes_into_the_control_channel_gets_the_sandbox_restarted(box: PythonSandbox) -> None:
    # The protocol's reply pipe is one of the low descriptors the worker keeps; scribble on all of them.
    out = await box.run("import os\nfor fd in range(3, 10):\n    try:\n        os.write(fd, b'garbage\\n')\n"
                        "    except OSError:\n        pass")
    assert out.startswith("Error: the sandbox wrote garbage into its control channel") and "restarted" in out
    assert await box.run("1 + 1") == "2\n"
