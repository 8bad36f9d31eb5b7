"""ScienceWorld through the resource engine with a real JVM (one, reused: each costs seconds and memory)."""

from __future__ import annotations

import time

import psutil
import pytest

from agentfly.context import RolloutContext
from agentfly.envs import SCIENCEWORLD
from agentfly.envs.scienceworld import java_available
from agentfly.resources import Pool, ResourceEngine
from agentfly.rewards.builtin.env import env_score
from agentfly.tools.builtin.scienceworld import sciworld_act, sciworld_look

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(java_available() is not None, reason=str(java_available())),
]


async def test_rollouts_reuse_one_pooled_jvm_each_with_its_own_task_and_score() -> None:
    spec = SCIENCEWORLD.replace(pool=Pool(min=1, max=1), acquire_timeout=30)
    async with ResourceEngine([spec]) as engine:
        jvm_pid = next(iter(engine.pools["scienceworld"].instances)).resource.pid
        first = RolloutContext(sample={"task": "find-living-thing", "variation": 0}, rollout_id="a",
                               group_id="g", resources=engine)
        look = await sciworld_look.invoke({}, context=first)
        assert look.ok and "Task: Your task is to find a(n) living thing" in look.observation
        moved = await sciworld_act.invoke({"action": "teleport to outside"}, context=first)
        assert "You teleport to the outside." in moved.observation
        assert (await env_score.score(None, None, first, first.sample)).reward > 0
        await first.aclose()
        await engine.settle()

        second = RolloutContext(sample={"task": "boil", "variation": 1}, rollout_id="b", group_id="g",
                                resources=engine)
        again = await sciworld_act.invoke({"action": "look around"}, context=second)
        assert "Task: Your task is to boil" in again.observation
        env = await second.resource("scienceworld")
        assert env.pid == jvm_pid and env.loaded == ("boil", 1)
        await second.aclose()
        third = RolloutContext(sample={}, rollout_id="c", group_id="g", resources=engine)
        bad = await sciworld_act.invoke({"action": "look around"}, context=third)
        assert "names no ScienceWorld task" in bad.observation
        await third.aclose()
        stats = engine.stats()["scienceworld"]
        assert stats["created"] == 1 and stats["kind"] == "environment"
        java = [c for c in psutil.Process(jvm_pid).children(recursive=True) if "java" in c.name()]
        assert java
    deadline = time.monotonic() + 10  # SIGKILL is sent; a JVM with many threads takes a moment to go
    while time.monotonic() < deadline and (alive(jvm_pid) or any(alive(j.pid) for j in java)):
        time.sleep(0.05)
    assert not alive(jvm_pid)
    assert not any(alive(j.pid) for j in java)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
