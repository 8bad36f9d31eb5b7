"""The agent layer: ``Agent`` and the tool-call parsers."""

from agentfly.agents.agent import Agent, build_engine
from agentfly.rollout.parsers import HermesParser, Parser, ParseResult, ReActParser, ToolCall, get_parser

__all__ = ["Agent", "HermesParser", "ParseResult", "Parser", "ReActParser", "ToolCall", "build_engine", "get_parser"]
