"""The agent layer's tools: ``@tool`` and the ``Tool`` it returns."""

from agentfly.tools.schema import ArgumentError, SchemaError, parse_docstring, type_schema
from agentfly.tools.tool import Tool, ToolResult, make_tool, tool

__all__ = ["ArgumentError", "SchemaError", "Tool", "ToolResult", "builtin", "make_tool", "parse_docstring", "tool", "type_schema"]

from agentfly.tools import builtin  # builtin tools use @tool from above
