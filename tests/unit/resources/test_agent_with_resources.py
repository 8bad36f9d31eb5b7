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
        for _ in range(400):  # until two rollouts hold the sandboxes (the other two wait to be admitted)
            await asyncio.sleep(0.05)
            stats = engine.stats()["python"]
            if stats["in_use"] == 2:
                break
        assert (stats["in_use"], stats["waiting"]) == (2, 0)
        batch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await batch
        await engine.settle()
        stats = engine.stats()["python"]
        assert (stats["in_use"], stats["waiting"]) == (0, 0)


def test_run_sync_calls_of_one_agent_reuse_the_sandboxes_an_earlier_call_started(tiny_tokenizer: Any) -> None:
    # A trainer calls run_sync once per step: its pooled sandboxes (or simulators) must outlive the call,
    # not be stopped and started again at every step.
    engine = af.ResourceEngine([PY])
    agent = af.Agent(model=af.ReplayEngine(tiny_tokenizer, script), tools=[python_code], resources=engine,
                     max_turns=4)
    pids = []
    for step in range(3):
        trajectories = agent.run_sync([{"question": f"#k={k}#"} for k in range(1, 5)])
        for k, traj in enumerate(trajectories, 1):  # each rollout still sees only its own state
            assert [c.observation for c in traj.tool_calls] == ["(no output)", f"{k * 10}\n"], step
        pids.append({slot.resource.pid for slot in engine.pools["python"].instances})
    stats = engine.stats()["python"]
    assert stats["acquires"] == 12 and stats["created"] <= 2
    assert pids[0] and pids[0] == pids[1] == pids[2]
    sandboxes = [slot.resource for slot in engine.pools["python"].instances]
    engine.close()  # on the loop the sandboxes belong to, idle between run_sync calls: stopped and waited for
    assert engine.stats()["python"]["size"] == 0
    assert not any(box.worker is not None and box.worker.alive for box in sandboxes)
    agent.close()


def test_an_agent_runs_again_after_close_and_refuses_run_sync_inside_a_running_loop(tiny_tokenizer: Any) -> None:
    agent = af.Agent(model=af.ReplayEngine(tiny_tokenizer, lambda prompt: "done"))
    assert agent.run_sync([{"question": "a"}])[0].final_answer == "done"
    agent.close()
    assert agent.run_sync([{"question": "b"}])[0].final_answer == "done"  # a new loop

    async def inside() -> None:
        agent.run_sync([{"question": "c"}])

    with pytest.raises(RuntimeError, match=r"inside a running event loop; use `await agent.run\(...\)`"):
        asyncio.run(inside())
    agent.close()


def test_an_agent_closed_or_dropped_inside_async_code_ends_its_loop_without_an_error(
        tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import gc
    import sys

    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    closed, dropped = (af.Agent(model=af.ReplayEngine(tiny_tokenizer, lambda prompt: "done")) for _ in range(2))
    loops = []
    for agent in (closed, dropped):
        agent.run_sync([{"question": "a"}])
        loops.append(agent._runner().get_loop())
    del agent

    async def inside() -> None:
        closed.close()
        nonlocal dropped
        del dropped
        gc.collect()  # its finalizer queues its loop (never closes it inside the collector)

    asyncio.run(inside())
    # The next close of any agent closes the queued loop, in ordinary code.
    af.Agent(model=af.ReplayEngine(tiny_tokenizer, lambda prompt: "done")).close()
    assert all(loop.is_closed() for loop in loops) and not unraisable


def test_an_agent_closes_the_pools_it_owns_and_leaves_shared_ones_to_their_owner(tiny_tokenizer: Any) -> None:
    owned = af.ResourceEngine([PY])
    agent = af.Agent(model=af.ReplayEngine(tiny_tokenizer, script), tools=[python_code], resources=owned,
                     owns_resources=True, max_turns=4)
    shared = af.ResourceEngine([PY])
    guest = af.Agent(model=af.ReplayEngine(tiny_tokenizer, script), tools=[python_code], resources=shared,
                     max_turns=4)
    for a in (agent, guest):
        assert a.run_sync([{"question": "#k=3#"}])[0].tool_calls[-1].observation == "30\n"
        assert a.resources is not None
    agent.close()
    guest.close()
    assert owned.closed and owned.stats()["python"]["size"] == 0  # its sandboxes stopped with it
    assert not shared.closed  # the caller's to close
    shared.close()


async def test_leaving_async_with_agent_stops_its_pools_on_the_running_loop(tiny_tokenizer: Any) -> None:
    pools = af.ResourceEngine([PY])
    async with af.Agent(model=af.ReplayEngine(tiny_tokenizer, script), tools=[python_code], resources=pools,
                        owns_resources=True, max_turns=4) as agent:
        [traj] = await agent.run([{"question": "#k=2#"}])
        assert traj.tool_calls[-1].observation == "20\n"
        assert pools.stats()["python"]["size"] == 1
    assert pools.closed and pools.stats()["python"]["size"] == 0
