"""The resource layer under the real rollout loop: ``Agent.run`` with sandbox tools, scripted turns
(``ReplayEngine``) and a ResourceEngine; every rollout holds its own sandbox and gives it back."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

import agentfly as af
from agentfly.tools.builtin.python_code import python_code

PY = af.ResourceSpec(name="python", factory=af.resources.PythonSandbox, pool=af.Pool(min=0, max=2),
                     acquire_timeout=30)


def call(code: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "python_code", "arguments": {"code": code}}) + "\n</tool_call>"


def script(prompt: str) -> str:
    """Turn 1 stores this rollout's number, turn 2 reads it back, turn 3 answers with what it saw."""
    k = int(re.search(r"#k=(\d+)#", prompt).group(1))
    seen = prompt.count("<tool_response>")
    if seen == 0:
        return call(f"k = {k}")
    if seen == 1:
        return call("k * 10")
    return "done"


async def test_each_rollout_keeps_its_own_sandbox_across_turns_and_returns_it(tiny_tokenizer: Any) -> None:
    async with af.ResourceEngine([PY]) as engine:
        agent = af.Agent(model=af.ReplayEngine(tiny_tokenizer, script), tools=[python_code], resources=engine,
                         max_turns=4)
        trajectories = await agent.run([{"question": f"#k={k}#"} for k in range(1, 5)])
        for k, traj in enumerate(trajectories, 1):
            assert traj.error is None and traj.finish_reason == "answer"
            assert [c.observation for c in traj.tool_calls] == ["(no output)", f"{k * 10}\n"]
        await engine.settle()
        stats = engine.stats()["python"]
        assert stats["in_use"] == 0 and stats["size"] <= 2 and stats["acquires"] == 4


async def test_cancelling_a_running_batch_returns_every_sandbox_to_the_pool(tiny_tokenizer: Any) -> None:
    def slow(prompt: str) -> str:
        return call("import time; time.sleep(5)") if "<tool_response>" not in prompt else "done"

    async with af.ResourceEngine([PY]) as engine:
        agent = af.Agent(model=af.ReplayEngine(tiny_tokenizer, slow), tools=[python_code], resources=engine)
        batch = asyncio.create_task(agent.run([{"question": "go"}] * 4))
        for _ in range(400):  # until two rollouts hold the sandboxes and two queue for them
            await asyncio.sleep(0.05)
            stats = engine.stats()["python"]
            if (stats["in_use"], stats["waiting"]) == (2, 2):
                break
        assert (stats["in_use"], stats["waiting"]) == (2, 2)
        batch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await batch
        await engine.settle()
        stats = engine.stats()["python"]
        assert (stats["in_use"], stats["waiting"]) == (0, 0)
