"""``code_tests``: run a task's unit tests against the agent's code in a sandbox; the reward is the pass rate.

The code is the last fenced ```python block of the final answer (or the whole answer when there is none).
Tests are a list of snippets (typically ``assert`` statements), each run separately after the code, so
the reward is graded: 3 of 4 passing gives 0.75. A test that hangs is killed at ``timeout`` and counts as
failed; the code is then loaded again into the restarted interpreter for the remaining tests.

The sandbox is a fresh lease from the job's "python" pool when the rollout has one (never the rollout's
own sandbox, whose state the agent may have changed), else a throwaway ``PythonSandbox``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from agentfly.resources.sandbox import PythonSandbox
from agentfly.rewards.reward import reward

_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S | re.I)
POOL = "python"


def extract_code(text: str | None) -> str:
    if not text:
        return ""
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


async def pass_rate(box: PythonSandbox, code: str, tests: Sequence[str], timeout: float = 5.0) -> dict[str, float]:
    """Run ``code`` then each test in ``box``; returns {"reward": pass rate, "passed", "total", "loaded"}."""
    if not tests:
        raise ValueError("code_tests needs at least one test; the sample's 'tests' list is empty")
    loaded = await box.execute(code, timeout)
    if not loaded.ok:
        return {"reward": 0.0, "passed": 0.0, "total": float(len(tests)), "loaded": 0.0}
    passed = 0
    for test in tests:
        result = await box.execute(test, timeout)
        if result.ok:
            passed += 1
        elif result.restarted:  # the interpreter was replaced: bring the code back for the next tests
            await box.execute(code, timeout)
    return {"reward": passed / len(tests), "passed": float(passed), "total": float(len(tests)), "loaded": 1.0}


@reward
async def code_tests(final_answer: str | None, tests: list[str] | str, context: Any = None,
                     timeout: float = 5.0) -> dict[str, float]:
    """The fraction of ``tests`` that pass against the code in the final answer."""
    test_list = [tests] if isinstance(tests, str) else list(tests)
    code = extract_code(final_answer)
    engine = getattr(context, "resources", None)
    if engine is not None and POOL in getattr(engine, "pools", {}):
        owner = f"{getattr(context, 'rollout_id', '?')}:code_tests"
        lease = await engine.acquire(POOL, owner=owner)
        try:
            return await pass_rate(lease.instance, code, test_list, timeout)
        finally:
            await engine.release(lease)
    async with PythonSandbox(timeout=timeout) as box:
        return await pass_rate(box, code, test_list, timeout)
