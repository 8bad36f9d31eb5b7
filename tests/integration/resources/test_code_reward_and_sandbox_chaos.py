"""The code_tests reward in real sandboxes, and chaos against real sandbox processes."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import psutil
import pytest

from agentfly.context import RolloutContext
from agentfly.resources import Pool, PythonSandbox, ResourceEngine, ResourceSpec
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


def our_processes() -> list[psutil.Process]:
    """Live sandbox processes this test process started (other fixtures' children are not counted)."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and any("_worker.py" in part for part in p.cmdline()):
                found.append(p)
        except psutil.Error:
            continue
    return found


@pytest.mark.slow
async def test_chaos_against_real_sandboxes_leaves_no_process_behind() -> None:
    rng = random.Random(7)
    codes = ["x = 1", "print(x)", "1/0", "import time; time.sleep(5)", "import os; os._exit(3)",
             "y = [0] * 10", "import threading, time; threading.Thread(target=time.sleep, args=(9,)).start()"]

    @tool(resource="python", timeout=0.5)
    async def py(code: str, context: Any) -> str:
        """Run code."""
        box = await context.resource("python")
        return await box.run(code, timeout=0.3)

    spec = ResourceSpec(name="python", factory=PythonSandbox, kind="sandbox", pool=Pool(min=1, max=3),
                        acquire_timeout=0.5)
    engine = ResourceEngine([spec])
    await engine.start()

    async def rollout(i: int) -> None:
        ctx = RolloutContext(sample={}, rollout_id=f"r{i}", group_id="g", resources=engine)
        try:
            for _ in range(rng.randint(1, 3)):
                await py.invoke({"code": rng.choice(codes)}, context=ctx)
                if rng.random() < 0.1:
                    ctx.mark_unhealthy("python")
        finally:
            await asyncio.shield(ctx.aclose())

    tasks = [asyncio.create_task(rollout(i)) for i in range(60)]
    for task in rng.sample(tasks, 10):
        asyncio.get_running_loop().call_later(rng.random() * 2, task.cancel)
    await asyncio.gather(*tasks, return_exceptions=True)
    await engine.settle()
    stats = engine.stats()["python"]
    assert stats["in_use"] == 0 and stats["waiting"] == 0 and stats["size"] <= 3
    assert len(our_processes()) == stats["size"]
    await engine.aclose()
    for _ in range(50):
        if not our_processes():
            break
        await asyncio.sleep(0.1)
    assert our_processes() == []
