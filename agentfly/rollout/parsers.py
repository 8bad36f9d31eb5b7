"""Tool-call parsers: find the tool calls in one assistant turn's text.

A parser never raises on model output: malformed calls come back as ``errors`` (each becomes an error
observation for the model and is counted), the rest as ``ToolCall``s.

- ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, several per turn (Qwen2.5, Hermes).
- ``react``: ``Thought: ...`` / ``Action: name`` / ``Action Input: {json}``; ``Final Answer: ...`` ends.
- ``command``: the turn's text is one command for the rollout's one tool, the way a text game is played
  ("go north", "take apple"); an empty turn ends the rollout. No tool schema is shown to the model.

Demonstrations are written in the Hermes format; ``rewrite`` turns a written assistant turn into another
parser's format (the SFT warm start replays them in the format the rollout uses).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass
class ToolCall:
    name: str
    arguments: Any
    id: str = ""
    raw: str = ""


@dataclass
class ParseResult:
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    content: str = ""  # the text with the calls removed
    final_answer: str | None = None  # what the parser recognises as the answer, if the format marks one


class Parser:
    name: ClassVar[str]
    # Strings that end a turn early when the format wants the runtime to answer (ReAct's Observation).
    stop: ClassVar[tuple[str, ...]] = ()
    # Whether the chat template shows the model the tools' JSON schemas (formats that name tools and arguments).
    shows_tools: ClassVar[bool] = True

    def parse(self, text: str) -> ParseResult:
        raise NotImplementedError

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        """The text a model should produce to call ``name`` (used to build demonstrations)."""
        raise NotImplementedError

    def format_answer(self, text: str) -> str:
        """The text a model should produce to end the rollout with the answer ``text``."""
        return text

    def format_turn(self, content: str, calls: list[ToolCall]) -> str:
        """The text of a turn that says ``content`` and makes ``calls``."""
        written = "\n".join(self.format_call(c.name, c.arguments) for c in calls)
        return f"{content}\n{written}" if content else written

    def bind(self, tools: Mapping[str, Any]) -> None:
        """Called with the rollout's tools (name -> tool) before any turn is parsed; a format that needs to know
        them (``command``) checks and keeps what it needs, and raises ``ValueError`` naming what is wrong."""


def _decode_call(payload: str) -> tuple[ToolCall | None, str | None]:
    try:
        obj = json.loads(payload)
    except json.JSONDecodeError as exc:
        return None, f"tool call is not valid JSON ({exc.msg} at position {exc.pos}): {payload[:200]!r}"
    if not isinstance(obj, dict):
        return None, f"tool call must be a JSON object with 'name' and 'arguments', got {payload[:200]!r}"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None, f"tool call has no 'name': {payload[:200]!r}"
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):  # some models emit the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None, f"arguments of tool call '{name}' are a string that is not JSON: {arguments[:200]!r}"
    return ToolCall(name=name, arguments=arguments, raw=payload), None


class HermesParser(Parser):
    name = "hermes"
    _block = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.S)

    def parse(self, text: str) -> ParseResult:
        result = ParseResult()
        for i, m in enumerate(self._block.finditer(text)):
            payload = m.group(1).strip()
            if not m.group(2):
                result.errors.append(f"unterminated <tool_call>: {payload[:200]!r}")
                continue
            call, error = _decode_call(payload)
            if error:
                result.errors.append(error)
            else:
                assert call is not None
                call.id = f"call_{i}"
                result.tool_calls.append(call)
        stray = text.count("</tool_call>") - sum(1 for m in self._block.finditer(text) if m.group(2))
        if stray > 0:
            result.errors.append("found </tool_call> without a matching <tool_call>")
        result.content = self._block.sub("", text).strip()
        return result

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


class ReActParser(Parser):
    name = "react"
    stop = ("Observation:",)
    _action = re.compile(r"Action\s*:\s*(.*?)\s*\n\s*Action\s*Input\s*:\s*(.*?)(?=\n\s*(?:Observation|Thought|Action|Final\s*Answer)\s*:|$)", re.S)
    _final = re.compile(r"Final\s*Answer\s*:\s*(.*)", re.S)

    def parse(self, text: str) -> ParseResult:
        result = ParseResult()
        text_wo_obs = text.split("Observation:")[0]
        final = self._final.search(text_wo_obs)
        for i, m in enumerate(self._action.finditer(text_wo_obs)):
            name, payload = m.group(1).strip(), m.group(2).strip()
            if not name:
                result.errors.append("Action has no tool name")
                continue
            try:
                arguments = json.loads(payload) if payload else {}
            except json.JSONDecodeError as exc:
                result.errors.append(f"Action Input of '{name}' is not valid JSON ({exc.msg}): {payload[:200]!r}")
                continue
            result.tool_calls.append(ToolCall(name=name, arguments=arguments, id=f"call_{i}", raw=m.group(0)))
        if not result.tool_calls and not result.errors and re.search(r"^\s*Action\s*:", text_wo_obs, re.M):
            result.errors.append("Action without an 'Action Input:' line")
        result.content = text_wo_obs.strip()
        if final and not result.tool_calls:
            result.final_answer = final.group(1).strip()
        return result

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        return f"Action: {name}\nAction Input: {json.dumps(arguments)}"

    def format_answer(self, text: str) -> str:
        return f"Final Answer: {text}"


class CommandParser(Parser):
    """A turn's first line is one command for ``tool``, passed as its argument ``argument``; an empty turn
    ends the rollout (its answer is empty). With ``tool``/``argument`` left empty, ``bind`` takes the
    rollout's one tool and that tool's one parameter."""

    name = "command"
    shows_tools = False

    def __init__(self, tool: str = "", argument: str = "") -> None:
        self.tool, self.argument = tool, argument

    def bind(self, tools: Mapping[str, Any]) -> None:
        if not self.tool:
            if len(tools) != 1:
                raise ValueError(f"the command format plays one tool's commands, and the rollout has {len(tools)} "
                                 f"tools ({', '.join(sorted(tools)) or 'none'}); give it exactly one tool, or use "
                                 "the hermes format")
            self.tool = next(iter(tools))
        if self.tool not in tools:
            raise ValueError(f"the command format's tool {self.tool!r} is not one of the rollout's tools "
                             f"({', '.join(sorted(tools)) or 'none'})")
        if not self.argument:
            params = list(getattr(tools[self.tool], "parameters", {}).get("properties", {}))
            if len(params) != 1:
                raise ValueError(f"the command format passes a turn's text as the one argument of {self.tool!r}, "
                                 f"which takes {len(params)} ({', '.join(params) or 'none'})")
            self.argument = params[0]

    def parse(self, text: str) -> ParseResult:
        lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
        if not lines:
            return ParseResult(content="")
        if not self.tool or not self.argument:
            raise RuntimeError("CommandParser.bind was not called with the rollout's tools")
        return ParseResult(tool_calls=[ToolCall(self.tool, {self.argument: lines[0]}, id="call_0", raw=text)])

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        values = list(arguments.values()) if self.argument not in arguments else [arguments[self.argument]]
        if len(values) != 1 or (self.tool and name != self.tool):
            raise ValueError(f"the command format writes one argument of {self.tool or 'its tool'}, not a call of "
                             f"{name} with {arguments!r}")
        return str(values[0])

    def format_answer(self, text: str) -> str:
        return ""  # an empty turn ends the rollout; a command format has no answer text

    def format_turn(self, content: str, calls: list[ToolCall]) -> str:
        return "\n".join(self.format_call(c.name, c.arguments) for c in calls)  # the command alone, no prose


PARSERS: dict[str, type[Parser]] = {"hermes": HermesParser, "react": ReActParser, "command": CommandParser}


def get_parser(parser: str | Parser) -> Parser:
    if isinstance(parser, Parser):
        return parser
    try:
        return PARSERS[parser]()
    except KeyError:
        raise ValueError(f"unknown tool-call parser {parser!r}; choose one of {sorted(PARSERS)}") from None


def rewrite(content: str, parser: Parser) -> str:
    """A written assistant turn (Hermes format: text and ``<tool_call>`` blocks) in ``parser``'s format."""
    if isinstance(parser, HermesParser):
        return content
    parsed = HermesParser().parse(content)
    if parsed.errors:
        raise ValueError(f"a written assistant turn is not in the Hermes format: {parsed.errors[0]}")
    if not parsed.tool_calls:
        return parser.format_answer(parsed.content)
    return parser.format_turn(parsed.content, parsed.tool_calls)
