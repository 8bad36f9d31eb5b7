"""The tool-call parsers, kept importable from here; they live in the rollout layer, which uses them
(``agentfly.rollout.parsers``)."""

from agentfly.rollout.parsers import HermesParser, Parser, ParseResult, ReActParser, ToolCall, get_parser

__all__ = ["HermesParser", "ParseResult", "Parser", "ReActParser", "ToolCall", "get_parser"]
