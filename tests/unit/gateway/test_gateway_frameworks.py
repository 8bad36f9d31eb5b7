"""The guide's agents, one per framework (the `openai` SDK, the OpenAI Agents SDK, pydantic-ai), run unmodified
against the gateway: the framework calls its tool from the model's tool call, and the recorded trajectory is
re-derived from the engine's own samples."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from agentfly.engines import Sampling
from tests.docs.test_docs_guides import blocks
from tests.unit.gateway.test_gateway_openai import assert_token_exact, take

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "guides" / "gateway.md"
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


@pytest.fixture
def guide_files(tmp_path, monkeypatch):
    """The guide's files, written as a reader would save them, importable."""
    for kind, name, text in blocks(GUIDE):
        if kind == "file":
            (tmp_path / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in ("rollouts", "openai_agent", "agents_sdk_agent", "pydantic_ai_agent"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("module", ["openai_agent", "agents_sdk_agent", "pydantic_ai_agent"])
def test_the_guides_agent_calls_its_tool_through_the_gateway_and_is_recorded_token_exact(
        guide_files, serve, turns_engine, module):
    engine = turns_engine([CALL, "The answer is 5."])
    server = serve(engine)
    sample = {"id": "q", "messages": [{"role": "system", "content": "You add numbers."},
                                      {"role": "user", "content": "What is 2 + 3?"}], "answer": "5"}
    ids = server.gateway.hand_out([sample], 1, Sampling(max_new_tokens=160))
    [handout] = take(server)
    agent = importlib.import_module(module)
    answer = agent.run(server.url, handout["api_key"], list(handout["messages"]))
    assert answer == "The answer is 5."
    server.gateway.set_reward(handout["rollout_id"], 1.0)
    [traj] = server.gateway.wait(ids)
    assert_token_exact(traj, engine.calls)
    # The framework ran the tool the model called, and sent its result back as a tool message.
    assert [(c.name, c.arguments, c.observation) for c in traj.tool_calls] == [("add", {"a": 2, "b": 3}, "5")]
    assert traj.reward_metrics["gateway/mismatches"] == 0.0 and traj.num_turns == 2
