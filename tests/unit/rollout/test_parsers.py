"""Tool-call parsers: calls found, malformed calls reported as errors, and no text ever crashes them."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentfly.agents import HermesParser, ParseResult, ReActParser, ToolCall, get_parser

hermes = HermesParser()
react = ReActParser()


# ---------------------------------------------------------------------------------------------- hermes
def test_it_finds_several_hermes_calls_in_one_turn() -> None:
    text = (
        "Let me compute both.\n"
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "37*48"}}\n</tool_call>\n'
        '<tool_call>{"name": "search", "arguments": {"query": "tides", "k": 2}}</tool_call>'
    )
    result = hermes.parse(text)
    assert result.errors == []
    assert [(c.name, c.arguments, c.id) for c in result.tool_calls] == [
        ("calculator", {"expression": "37*48"}, "call_0"),
        ("search", {"query": "tides", "k": 2}, "call_1"),
    ]
    assert result.content == "Let me compute both."
    assert result.final_answer is None


def test_it_returns_plain_text_without_calls_as_content() -> None:
    result = hermes.parse("  The answer is 1776.  ")
    assert result == ParseResult([], [], "The answer is 1776.", None)


def test_it_accepts_parameters_and_json_string_arguments_and_defaults_to_no_arguments() -> None:
    text = (
        '<tool_call>{"name": "a", "parameters": {"x": 1}}</tool_call>'
        '<tool_call>{"name": "b", "arguments": "{\\"y\\": 2}"}</tool_call>'
        '<tool_call>{"name": "c"}</tool_call>'
    )
    result = hermes.parse(text)
    assert result.errors == []
    assert [(c.name, c.arguments) for c in result.tool_calls] == [("a", {"x": 1}), ("b", {"y": 2}), ("c", {})]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('<tool_call>{"name": "calc", "arguments": {"expression": "1+1"}</tool_call>', "not valid JSON"),
        ("<tool_call></tool_call>", "not valid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', "has no 'name'"),
        ('<tool_call>{"name": "", "arguments": {}}</tool_call>', "has no 'name'"),
        ('<tool_call>{"name": 3}</tool_call>', "has no 'name'"),
        ('<tool_call>["calc", {}]</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "calc", "arguments": "not json"}</tool_call>', "a string that is not JSON"),
        ('<tool_call>{"name": "calc", "arguments": {}}', "unterminated <tool_call>"),
        ('done </tool_call>', "without a matching <tool_call>"),
    ],
    ids=["bad-json", "empty", "no-name", "empty-name", "name-not-string", "not-object", "string-args",
         "unterminated", "stray-close"],
)
def test_it_reports_malformed_hermes_calls_as_errors(text: str, error: str) -> None:
    result = hermes.parse(text)
    assert result.tool_calls == []
    assert len(result.errors) == 1 and error in result.errors[0]


def test_it_keeps_good_calls_next_to_a_malformed_one() -> None:
    text = (
        '<tool_call>{"name": "ok", "arguments": {}}</tool_call>'
        "<tool_call>{oops}</tool_call>"
        '<tool_call>{"name": "also_ok", "arguments": {"n": 1}}</tool_call>'
    )
    result = hermes.parse(text)
    assert [c.name for c in result.tool_calls] == ["ok", "also_ok"]
    assert [c.id for c in result.tool_calls] == ["call_0", "call_2"]  # ids follow the call's position
    assert len(result.errors) == 1 and "{oops}" in result.errors[0]


def test_it_formats_hermes_calls_that_it_parses_back() -> None:
    text = hermes.format_call("calculator", {"expression": "2*(3+4)"})
    assert hermes.parse(text).tool_calls == [
        ToolCall("calculator", {"expression": "2*(3+4)"}, "call_0", json.dumps(
            {"name": "calculator", "arguments": {"expression": "2*(3+4)"}}))
    ]


# ---------------------------------------------------------------------------------------------- react
def test_it_parses_a_react_action() -> None:
    text = 'Thought: I need the product.\nAction: calculator\nAction Input: {"expression": "37*48"}\n'
    result = react.parse(text)
    assert result.errors == []
    assert [(c.name, c.arguments) for c in result.tool_calls] == [("calculator", {"expression": "37*48"})]
    assert result.final_answer is None


def test_it_ignores_what_the_model_writes_after_observation() -> None:
    text = 'Action: calculator\nAction Input: {"expression": "1+1"}\nObservation: 3\nAction: evil\nAction Input: {}'
    result = react.parse(text)
    assert [c.name for c in result.tool_calls] == ["calculator"]
    assert "Observation" not in result.content


def test_it_reads_a_react_final_answer() -> None:
    result = react.parse("Thought: I know it.\nFinal Answer: 1776")
    assert result.tool_calls == [] and result.errors == []
    assert result.final_answer == "1776"


def test_it_prefers_an_action_over_a_final_answer_in_the_same_turn() -> None:
    result = react.parse('Action: calculator\nAction Input: {"expression": "2"}\nFinal Answer: 2')
    assert [(c.name, c.arguments) for c in result.tool_calls] == [("calculator", {"expression": "2"})]
    assert result.errors == []
    assert result.final_answer is None


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("Action: calculator\nAction Input: {expression: 1}", "Action Input of 'calculator' is not valid JSON"),
        ("Thought: hmm\nAction: calculator\n", "Action without an 'Action Input:' line"),
        ("Action: \nAction Input: {}", "Action has no tool name"),
    ],
    ids=["bad-json", "no-input", "no-name"],
)
def test_it_reports_malformed_react_actions(text: str, error: str) -> None:
    result = react.parse(text)
    assert result.tool_calls == []
    assert len(result.errors) == 1 and error in result.errors[0]


def test_it_stops_react_turns_at_observation() -> None:
    assert ReActParser.stop == ("Observation:",)
    assert HermesParser.stop == ()


def test_it_formats_react_calls_that_it_parses_back() -> None:
    text = react.format_call("search", {"query": "q"})
    assert [(c.name, c.arguments) for c in react.parse(text).tool_calls] == [("search", {"query": "q"})]


def test_it_looks_parsers_up_by_name_and_names_the_choices_otherwise() -> None:
    assert isinstance(get_parser("hermes"), HermesParser)
    assert isinstance(get_parser("react"), ReActParser)
    assert get_parser(hermes) is hermes
    with pytest.raises(ValueError, match=r"unknown tool-call parser 'json'; choose one of \['command', 'hermes', 'react'\]"):
        get_parser("json")


# ---------------------------------------------------------------------------------------------- fuzzing
# Text made of the formats' own pieces reaches far deeper into the parsers than uniform random text.
FRAGMENTS = [
    "<tool_call>", "</tool_call>", "{", "}", "[", "]", '"', ":", ",", '"name"', '"arguments"', '"parameters"',
    '"calculator"', "null", "1", "-2.5e3", "\\", '\\"', "\n", " ", "Thought:", "Action:", "Action Input:",
    "Observation:", "Final Answer:", "Action", "Input", "é", "\u2063", "\x00",
]
fragment_text = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=5)), max_size=40).map("".join)
any_text = st.one_of(st.text(), fragment_text)


def check_result(result: ParseResult) -> None:
    assert isinstance(result, ParseResult)
    assert all(isinstance(e, str) and e for e in result.errors)
    for call in result.tool_calls:
        assert isinstance(call.name, str) and call.name
        assert isinstance(call.id, str) and call.id.startswith("call_")
    assert isinstance(result.content, str)
    assert result.final_answer is None or isinstance(result.final_answer, str)


@settings(max_examples=300, deadline=None)
@given(any_text)
def test_it_never_crashes_the_hermes_parser(text: str) -> None:
    result = hermes.parse(text)
    check_result(result)
    # A turn that opens a call yields a call or an error, never silence (the model must hear back).
    if "<tool_call>" in text or "</tool_call>" in text:
        assert result.tool_calls or result.errors


@settings(max_examples=300, deadline=None)
@given(any_text)
def test_it_never_crashes_the_react_parser(text: str) -> None:
    check_result(react.parse(text))


TOOL_NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.-]{0,24}", fullmatch=True)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet=st.characters(blacklist_categories=("Cs",))),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=100, deadline=None)
@given(TOOL_NAMES, st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=4))
def test_it_parses_back_any_call_it_formats(name: str, arguments: dict) -> None:
    for parser in (hermes, react):
        result = parser.parse(parser.format_call(name, arguments))
        assert result.errors == [], parser.name
        assert [(c.name, c.arguments) for c in result.tool_calls] == [(name, arguments)], parser.name


# ---------------------------------------------------------------------------------------------- command
def _game_tools() -> dict:
    from agentfly.tools.builtin.textworld import tw_act

    return {"tw_act": tw_act}


def test_in_the_command_format_a_turn_s_first_line_is_one_call_of_the_rollout_s_one_tool() -> None:
    parser = get_parser("command")
    parser.bind(_game_tools())
    result = parser.parse("  go north \nand then I will look around")
    assert [(c.name, c.arguments) for c in result.tool_calls] == [("tw_act", {"command": "go north"})]
    assert result.errors == []


def test_in_the_command_format_an_empty_turn_ends_the_rollout() -> None:
    parser = get_parser("command")
    parser.bind(_game_tools())
    assert parser.parse(" \n ") == ParseResult([], [], "", None)


def test_the_command_format_refuses_a_rollout_without_exactly_one_one_argument_tool() -> None:
    from agentfly.tools.builtin.calculator import calculator

    with pytest.raises(ValueError, match=r"one tool's commands, and the rollout has 2 tools \(calculator, tw_act\)"):
        get_parser("command").bind({**_game_tools(), "calculator": calculator})
    with pytest.raises(ValueError, match="'search' is not one of the rollout's tools"):
        type(get_parser("command"))(tool="search").bind(_game_tools())


def test_a_written_hermes_turn_is_rewritten_into_each_format_and_parses_back_to_the_same_call() -> None:
    from agentfly.rollout.parsers import rewrite

    written = '<tool_call>\n{"name": "tw_act", "arguments": {"command": "open fridge"}}\n</tool_call>'
    command = get_parser("command")
    command.bind(_game_tools())
    assert rewrite(written, command) == "open fridge"
    assert rewrite("I won the game.", command) == ""  # no answer text in a command format: an empty turn
    assert rewrite(written, hermes) == written
    assert rewrite("It is 4.", react) == "Final Answer: It is 4." and react.parse(rewrite("It is 4.", react)).final_answer == "It is 4."
    for parser in (command, react):
        calls = parser.parse(rewrite(written, parser)).tool_calls
        assert [(c.name, c.arguments) for c in calls] == [("tw_act", {"command": "open fridge"})], parser.name


@settings(max_examples=300, deadline=None)
@given(any_text)
def test_it_never_crashes_the_command_parser(text: str) -> None:
    parser = get_parser("command")
    parser.bind(_game_tools())
    result = parser.parse(text)
    check_result(result)
    assert len(result.tool_calls) == (1 if text.strip() else 0)
