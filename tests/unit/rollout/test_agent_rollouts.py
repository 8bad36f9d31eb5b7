"""The agent loop end to end on scripted turns: rewards, errors that become observations, turn limits, groups."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

import agentfly as af
from agentfly.rewards import RewardError
from agentfly.rewards.builtin import math_equal
from agentfly.tools.builtin import calculator


def call(name: str, **arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def question(k: int, text: str = "What is 37*48?") -> str:
    return f"{text} #rollout={k}#"


async def test_it_scores_a_calculator_rollout_with_math_equal(scripted_engine: Callable[..., Any]) -> None:
    engine = scripted_engine([
        [call("calculator", expression="37*48"), "The answer is 1776."],
        [call("calculator", expression="37*48"), "The answer is 1767."],
    ])
    agent = af.Agent(model=engine, tools=[calculator], reward=math_equal, max_turns=4)
    right, wrong = await agent.run([{"id": "a", "question": question(0), "answer": "1776"},
                                    {"id": "b", "question": question(1), "answer": "1776"}])
    assert (right.reward, right.reward_error, right.finish_reason) == (1.0, None, "answer")
    assert right.final_answer == "The answer is 1776."
    assert [(c.name, c.arguments, c.observation, c.error) for c in right.tool_calls] == [
        ("calculator", {"expression": "37*48"}, "1776", None)]
    assert [m["role"] for m in right.messages] == ["user", "assistant", "tool", "assistant"]
    assert right.messages[2] == {"role": "tool", "name": "calculator", "content": "1776"}
    assert (wrong.reward, wrong.reward_error) == (0.0, None)
    assert "reward" in right.timings and "generate" in right.timings and "tools" in right.timings


async def test_it_checks_reward_inputs_before_any_rollout_runs(scripted_engine: Callable[..., Any]) -> None:
    @af.reward
    def needs_gold(final_answer: str, gold: str) -> float:
        return 1.0

    engine = scripted_engine([["hi"], ["hi"]])
    agent = af.Agent(model=engine, reward=needs_gold)
    with pytest.raises(RewardError, match="'gold'"):
        await agent.run([{"question": question(0), "gold": "1"}, {"question": question(1)}])
    assert engine.generations == {}  # nothing was generated: the bad sample stopped the batch up front


async def test_it_records_a_failing_reward_and_keeps_the_trajectory(scripted_engine: Callable[..., Any]) -> None:
    @af.reward
    async def flaky(final_answer: str) -> float:
        raise RuntimeError("judge unavailable")

    agent = af.Agent(model=scripted_engine([["42"]]), reward=flaky)
    (t,) = await agent.run([{"question": question(0)}])
    assert t.reward == 0.0 and t.reward_error == "reward 'flaky' raised RuntimeError: judge unavailable"
    assert t.finish_reason == "answer" and t.error is None


async def test_it_passes_the_trajectory_and_context_to_rewards(scripted_engine: Callable[..., Any]) -> None:
    @af.reward
    def metrics(trajectory: af.Trajectory, context: af.RolloutContext, difficulty: int) -> dict[str, float]:
        return {"reward": float(trajectory.num_turns), "difficulty": difficulty,
                "same_rollout": float(context.rollout_id == trajectory.rollout_id)}

    agent = af.Agent(model=scripted_engine([[call("calculator", expression="1+1"), "2"]]), tools=[calculator],
                     reward=metrics)
    (t,) = await agent.run([{"id": "m", "question": question(0), "difficulty": 3}])
    assert (t.reward, t.reward_metrics) == (2.0, {"difficulty": 3.0, "same_rollout": 1.0})


async def test_it_answers_unknown_tools_bad_arguments_and_malformed_calls_with_errors(
    scripted_engine: Callable[..., Any],
) -> None:
    turn = (call("search", query="x") + call("calculator", expr="1") + "<tool_call>{not json}</tool_call>"
            + call("calculator", expression="2*3"))
    agent = af.Agent(model=scripted_engine([[turn, "6"]]), tools=[calculator])
    (t,) = await agent.run([{"question": question(0)}])
    assert t.error is None and t.finish_reason == "answer" and t.final_answer == "6"
    parse_error, unknown, bad_args, good = t.tool_calls
    assert parse_error.name == "<parse error>" and "not valid JSON" in parse_error.observation
    assert unknown.error == "unknown tool 'search'; available tools: calculator"
    assert bad_args.error is not None and "expression: Field required" in bad_args.error
    assert "expr: unexpected argument" in bad_args.error
    assert (good.observation, good.error) == ("6", None)
    assert t.tool_errors == 3 and t.parse_errors == 1
    assert t.turns[0].tool_calls == ["search", "calculator", "calculator"]
    tool_texts = [m["content"] for m in t.messages if m["role"] == "tool"]
    assert tool_texts == [c.observation for c in t.tool_calls]  # every error reached the model


async def test_it_stops_at_max_turns(scripted_engine: Callable[..., Any]) -> None:
    agent = af.Agent(model=scripted_engine([[call("calculator", expression="1")] * 5]), tools=[calculator],
                     max_turns=2)
    (t,) = await agent.run([{"question": question(0)}])
    assert t.finish_reason == "max_turns" and t.num_turns == 2
    assert len(t.tool_calls) == 1  # the last turn's call is not run: no turn is left to read its result
    assert t.final_answer is None


async def test_it_stops_at_the_context_length(scripted_engine: Callable[..., Any], tiny_tokenizer: Any) -> None:
    sample = {"question": question(0)}
    prompt = af.Agent(model=scripted_engine([[]]), tools=[calculator]).runner.renderer.prompt_ids(
        [{"role": "user", "content": sample["question"]}])
    long_turn = call("calculator", expression="1+1") + " thinking" * 30
    agent = af.Agent(model=scripted_engine([[long_turn] * 4]), tools=[calculator], max_turns=4,
                     max_length=len(prompt) + 150)
    (t,) = await agent.run([sample])
    assert t.finish_reason == "length"
    assert len(t.token_ids) <= len(prompt) + 150
    too_short = af.Agent(model=scripted_engine([["x"]]), tools=[calculator], max_length=len(prompt))
    (t,) = await too_short.run([sample])
    assert (t.finish_reason, t.num_turns, len(t.token_ids)) == ("length", 0, len(prompt))


async def test_it_reports_a_broken_rollout_without_losing_the_batch(tiny_tokenizer: Any) -> None:
    def script(prompt_text: str) -> str:
        if "#rollout=1#" in prompt_text:
            raise ConnectionError("engine went away")
        return "fine"

    agent = af.Agent(model=af.ReplayEngine(tiny_tokenizer, script))
    ok, broken = await agent.run([{"question": question(0)}, {"question": question(1)}])
    assert (ok.finish_reason, ok.final_answer) == ("answer", "fine")
    assert (broken.finish_reason, broken.error) == ("error", "ConnectionError: engine went away")


async def test_it_orders_groups_sample_by_sample_with_ids(scripted_engine: Callable[..., Any]) -> None:
    agent = af.Agent(model=scripted_engine([["a"], ["b"]]))
    trajectories = await agent.run([{"id": "p", "question": question(0)}, {"question": question(1)}], group_size=3)
    assert [(t.group_id, t.rollout_id) for t in trajectories] == [
        ("p", "p/0"), ("p", "p/1"), ("p", "p/2"), ("1", "1/0"), ("1", "1/1"), ("1", "1/2")]
    assert [t.sample["question"] for t in trajectories] == [question(0)] * 3 + [question(1)] * 3


async def test_it_injects_the_rollout_context_into_tools(scripted_engine: Callable[..., Any]) -> None:
    @af.tool
    def where(context: af.RolloutContext) -> str:
        return f"{context.rollout_id} of {context.group_id}: {context.sample['topic']}"

    agent = af.Agent(model=scripted_engine([[call("where"), "ok"]]), tools=[where])
    (t,) = await agent.run([{"id": "g", "question": question(0), "topic": "tides"}])
    assert t.tool_calls[0].observation == "g/0 of g: tides"


async def test_it_turns_a_missing_resource_engine_into_an_error_observation(
    scripted_engine: Callable[..., Any],
) -> None:
    @af.tool(resource="python")
    async def run_python(code: str, context: af.RolloutContext) -> str:
        sandbox = await context.resource("python")
        return str(sandbox)

    agent = af.Agent(model=scripted_engine([[call("run_python", code="1"), "ok"]]), tools=[run_python])
    (t,) = await agent.run([{"question": question(0)}])
    assert t.error is None and t.tool_calls[0].error is not None
    assert "no ResourceEngine" in t.tool_calls[0].error


def test_it_runs_synchronously_too(scripted_engine: Callable[..., Any]) -> None:
    agent = af.Agent(model=scripted_engine([[call("calculator", expression="6*7"), "42"]]), tools=[calculator],
                     reward=math_equal)
    (t,) = agent.run_sync([{"question": question(0), "answer": 42}])
    assert t.reward == 1.0


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"tools": [calculator, calculator]}, "two tools are named 'calculator'"),
        ({"parser": "xml"}, "unknown tool-call parser 'xml'"),
        ({"max_turns": 0}, "max_turns must be >= 1"),
    ],
)
def test_it_rejects_a_bad_configuration_with_the_fix(scripted_engine: Callable[..., Any], kwargs: dict[str, Any],
                                                     error: str) -> None:
    with pytest.raises(ValueError, match=error):
        af.Agent(model=scripted_engine([]), **kwargs)


def test_it_reports_a_sample_without_a_question_as_a_failed_rollout(scripted_engine: Callable[..., Any]) -> None:
    (t,) = af.Agent(model=scripted_engine([])).run_sync([{"text": "no question key"}])
    assert t.finish_reason == "error" and t.error is not None and "'question'/'prompt'" in t.error


def test_it_rejects_unknown_engines_and_missing_models(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="unknown engine 'tgi'"):
        af.Agent(model=tmp_path, engine="tgi")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        af.Agent(model=tmp_path / "nope", engine="hf")


async def test_it_runs_react_rollouts_to_the_final_answer(scripted_engine: Callable[..., Any]) -> None:
    engine = scripted_engine([[
        'Thought: multiply first.\nAction: calculator\nAction Input: {"expression": "37*48"}\nObservation:',
        "Thought: done.\nFinal Answer: 1776",
    ]])
    agent = af.Agent(model=engine, tools=[calculator], parser="react", reward=math_equal)
    (t,) = await agent.run([{"question": question(0), "answer": "1776"}])
    assert [(c.name, c.observation) for c in t.tool_calls] == [("calculator", "1776")]
    assert (t.final_answer, t.reward, t.finish_reason) == ("1776", 1.0, "answer")


async def test_it_starts_from_a_sample_conversation_without_adding_a_second_system_prompt(
    scripted_engine: Callable[..., Any], tiny_tokenizer: Any,
) -> None:
    history = [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": question(0)},
    ]
    agent = af.Agent(model=scripted_engine([["ok"]]), tools=[calculator], system_prompt="Be verbose.")
    (t,) = await agent.run([{"messages": history}])
    expected = tiny_tokenizer.apply_chat_template(history, tools=[calculator.schema], tokenize=False,
                                                  add_generation_prompt=True)
    assert t.token_ids[: t.prompt_length] == tiny_tokenizer(expected, add_special_tokens=False)["input_ids"]
    assert t.messages[:4] == history and "Be verbose." not in tiny_tokenizer.decode(t.token_ids)


async def test_it_wraps_plain_functions_as_tools_and_rewards(scripted_engine: Callable[..., Any]) -> None:
    def double(n: int) -> int:
        """Double a number."""
        return 2 * n

    def exact(final_answer: str, answer: str) -> float:
        return float(final_answer == answer)

    agent = af.Agent(model=scripted_engine([[call("double", n=21), "42"]]), tools=[double], reward=exact)
    assert agent.tools["double"].schema["function"]["description"] == "Double a number."
    (t,) = await agent.run([{"question": question(0), "answer": "42"}])
    assert (t.tool_calls[0].observation, t.reward) == ("42", 1.0)
