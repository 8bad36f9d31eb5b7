"""The code_tests reward in real sandboxes, and chaos against real sandbox processes."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import psutil
import pytest

from agentfly.context import RolloutContext
from agentfly.resources import Pool, PythonSandbox, ResourceEngine, ResourceSpec, ResourceTimeout
from agentfly.rewards.builtin.code import code_tests
from agentfly.tools import tool

SOLUTION = "Here it is:\n```python\ndef add(a, b):\n    return a + b if a != 3 else 0\n```"
TESTS = ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(3, 1) == 4", "assert add(-1, 1) == 0"]


async def test_code_tests_scores_the_pass_rate_of_the_final_answers_code() -> None:
    result = await code_tests.score(SOLUTION, None, None, {"tests": TESTS})
    assert result.error is None
    assert result.reward == 0.75 and result.metrics == {"passed": 3.0, "total": 4.0, "loaded": 1.0}


async def test_a_hanging_test_fails_alone_and_the_code_is_reloaded_for_the_rest() -> None:
    tests = ["assert add(1, 1) == 2", "while True:\n    pass", "assert add(2, 2) == 4"]
    result = await code_tests.score(SOLUTION, None, None, {"tests": tests, "timeout": 1.0})
    assert result.reward == pytest.approx(2 / 3)


async def test_code_that_does_not_even_load_scores_zero() -> None:
    result = await code_tests.score("```python\ndef add(a, b)\n```", None, None, {"tests": TESTS})
    assert result.reward == 0.0 and result.metrics["loaded"] == 0.0


async def test_code_tests_borrows_a_clean_sandbox_from_the_jobs_pool_not_the_rollouts_own() -> None:
    spec = ResourceSpec(name="python", factory=PythonSandbox, kind="sandbox", pool=Pool(0, 2))
    async with ResourceEngine([spec]) as engine:
        ctx = RolloutContext(sample={"tests": TESTS}, rollout_id="r", group_id="g", resources=engine)
        mine = await ctx.resource("python")
        await mine.run("def add(a, b):\n    return 'sabotaged'")
        result = await code_tests.score(SOLUTION, None, ctx, ctx.sample)
        assert result.reward == 0.75
        assert await mine.run("add(1, 2)") == "'sabotaged'\n"
        await ctx.aclose()
        await engine.settle()
        assert engine.stats()["python"]["in_use"] == 0


def our_processes(launchers: bool = False) -> list[psutil.Process]:
    """Live sandbox interpreters this test process started (other fixtures' children are not counted, nor the
    bubblewrap processes each sandbox runs under, nor the process that waits above its interpreter as root:
    they end with it)."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if (p.status() != psutil.STATUS_ZOMBIE and (launchers or p.name() not in ("bwrap", "sandbox-init"))
                    and any("_worker.py" in part for part in p.cmdline())):
                found.append(p)
        except psutil.Error:
            continue
    return found


# What each code does in a sandbox, as the tool's observation (None: it prints nothing).
OUTCOMES = {
    "x = 1": None,
    "print(x)": ("1\n", "NameError: name 'x' is not defined"),  # x survives only within one rollout's sandbox
    "1/0": ("ZeroDivisionError: division by zero",),
    "import time; time.sleep(5)": ("Error: execution timed out after 0.3 s and was killed",),
    "import os; os._exit(3)": ("Error: sandbox process exited (exit code 3)",),
    "y = [0] * 10": None,
    "import threading, time; threading.Thread(target=time.sleep, args=(9,)).start()": None,
}
# What any call may meet instead: the tool's own timeout (a kill and restart that outlasts it), or the
# sandbox's timeout on a machine too busy to run even `x = 1`. (Every pooled sandbox busy for acquire_timeout
# is the infrastructure's failure, not an observation: it ends the rollout with ResourceTimeout.)
CONTENTION = ("Error: tool 'py' timed out after 0.5 s", "Error: execution timed out after 0.3 s and was killed")


@pytest.mark.slow
async def test_chaos_against_real_sandboxes_leaves_no_process_behind() -> None:
    rng = random.Random(7)
    codes = list(OUTCOMES)

    @tool(resource="python", timeout=0.5)
    async def py(code: str, context: Any) -> str:
        """Run code."""
        box = await context.resource("python")
        return await box.run(code, timeout=0.3)

    spec = ResourceSpec(name="python", factory=PythonSandbox, kind="sandbox", pool=Pool(min=1, max=3),
                        acquire_timeout=0.5)
    engine = ResourceEngine([spec])
    await engine.start()
    calls: list[tuple[str, str]] = []  # (code, observation) of every call that returned, cancelled rollouts' too

    async def rollout(i: int) -> int:
        ctx = RolloutContext(sample={}, rollout_id=f"r{i}", group_id="g", resources=engine)
        try:
            for _ in range(rng.randint(1, 3)):
                code = rng.choice(codes)
                calls.append((code, (await py.invoke({"code": code}, context=ctx)).observation))
                if rng.random() < 0.1:
                    ctx.mark_unhealthy("python")
        finally:
            await asyncio.shield(ctx.aclose())
        return i

    tasks = [asyncio.create_task(rollout(i)) for i in range(60)]
    doomed = rng.sample(range(60), 10)
    for i in doomed:
        asyncio.get_running_loop().call_later(rng.random() * 2, tasks[i].cancel)
    results = await asyncio.gather(*tasks, return_exceptions=True)

    # Each rollout finished, was one of the ten cancelled mid-way, or waited out a full pool, which ended it as
    # the infrastructure's failure (as the rollout loop ends it); nothing else escaped.
    cancelled = {i for i, r in enumerate(results) if isinstance(r, asyncio.CancelledError)}
    waited = {i for i, r in enumerate(results) if isinstance(r, ResourceTimeout)}
    assert all(results[i].kind == "acquire_timeout" for i in waited)  # type: ignore[union-attr]
    assert [r for i, r in enumerate(results) if i not in cancelled | waited] == [
        i for i in range(60) if i not in cancelled | waited]
    assert cancelled and cancelled <= set(doomed), cancelled
    # Each call's observation is what its code does, or contention; tool errors never became exceptions.
    for code, observation in calls:
        expected = OUTCOMES[code]
        if observation.startswith(CONTENTION) or (expected is None and observation == ""):
            continue
        assert expected is not None and any(e in observation for e in expected), (code, observation)
    # The chaos happened: rollouts waited out a full pool, and some calls reached a real sandbox.
    ran = [o for _, o in calls if not o.startswith(CONTENTION)]
    assert waited and ran, calls

    await engine.settle()
    stats = engine.stats()["python"]
    assert stats["in_use"] == 0 and stats["waiting"] == 0 and stats["size"] <= 3
    assert stats["timeouts"] == len(waited)  # every wait the pool gave up on reached its caller as an error
    # Every sandbox made is either in the pool or destroyed (killed, failed its reset, marked unhealthy).
    assert stats["created"] == stats["size"] + stats["destroyed"], stats
    assert len(our_processes()) == stats["size"]
    await engine.aclose()
    for _ in range(50):
        if not our_processes(launchers=True):
            break
        await asyncio.sleep(0.1)
    assert our_processes(launchers=True) == []
