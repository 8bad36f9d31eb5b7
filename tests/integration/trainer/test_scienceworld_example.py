"""The ScienceWorld example on the CPU: demonstrations from the simulator's gold actions, and a warm start
that acts (valid tool calls that acquire a pooled simulator) on variations it was never shown."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from agentfly.agents.parsers import HermesParser
from agentfly.envs.scienceworld import java_available, task_index

ROOT = Path(__file__).parents[3]
WARM_START = ROOT / "examples/scienceworld/warm_start"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(java_available() is not None, reason=str(java_available())),
]


def make_demos() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_demos", ROOT / "examples/scienceworld/make_demos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_demonstrations_replay_the_gold_actions_as_parseable_tool_calls_with_real_observations(
        tmp_path: Path) -> None:
    demos = make_demos()
    counts = asyncio.run(demos.build(tmp_path, ["find-non-living-thing"], per_task=2, held_out=2, max_actions=12))
    assert counts == {"demos": 2, "test": 2}
    rows = [json.loads(line) for line in (tmp_path / "demos.jsonl").read_text().splitlines()]
    parser = HermesParser()
    for row in rows:
        messages = row["messages"]
        calls = []
        for m in messages[1:-1]:
            if m["role"] == "assistant":
                parsed = parser.parse(m["content"])
                assert not parsed.errors and len(parsed.tool_calls) == 1
                assert parsed.tool_calls[0].name == "sciworld_act"
                calls.append(parsed.tool_calls[0].arguments["action"])
        assert calls == row["gold_actions"] and calls
        observations = [m["content"] for m in messages if m["role"] == "tool"]
        # The tool's own output: the intro on the first call, the simulator's score after each action.
        assert observations[0].startswith("Task: Your task is to find a(n) non-living thing")
        assert "(score 100/100. The task is complete.)" in observations[-1]
        assert messages[-1] == {"role": "assistant", "content": demos.DONE}
        assert messages[0]["content"] == row["sample"]["prompt"]
    index = task_index()["tasks"]["find-non-living-thing"]
    train = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    test = [json.loads(line) for line in (tmp_path / "test.jsonl").read_text().splitlines()]
    assert {s["variation"] for s in train} <= set(index["train"])
    assert {s["variation"] for s in test} <= set(index["test"])
    assert not {s["variation"] for s in train} & {s["variation"] for s in test}


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(not (WARM_START / "model.safetensors").is_file(), reason="no shipped ScienceWorld warm start")
def test_the_warm_start_makes_a_valid_tool_call_that_acquires_a_simulator_on_a_held_out_variation() -> None:
    import torch

    import agentfly as af
    from agentfly.engines.hf import HFEngine
    from agentfly.envs import SCIENCEWORLD
    from agentfly.envs.scienceworld import scienceworld_tasks
    from agentfly.resources import Pool
    from agentfly.rewards.builtin.env import env_score
    from agentfly.tools.builtin.scienceworld import sciworld_act, sciworld_look

    torch.set_num_threads(1)
    sample = scienceworld_tasks("test", tasks=["find-non-living-thing"])[0]  # a test variation, never demonstrated
    resources = af.ResourceEngine([SCIENCEWORLD.replace(pool=Pool(min=0, max=1), acquire_timeout=300)])
    agent = af.Agent(HFEngine(str(WARM_START)), tools=[sciworld_act, sciworld_look], reward=env_score,
                     parser="hermes", max_turns=3, resources=resources)
    [trajectory] = agent.run_sync([sample], sampling=af.Sampling(temperature=0.0, max_new_tokens=48))
    calls = [c for c in trajectory.tool_calls if c.error is None]
    assert calls and calls[0].name == "sciworld_act", trajectory.turns[0].text
    assert "Task: Your task is to find" in calls[0].observation  # the simulator loaded this held-out variation
    stats = resources.stats()["scienceworld"]
    assert stats["acquires"] == 1 and stats["created"] == 1  # one simulator, kept across the rollout's turns
