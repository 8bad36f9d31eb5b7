"""Shared plugin tools for the "try it" pool's tests: one that never ends, one that answers at once."""

from __future__ import annotations

import time

from agentfly.tools import tool


@tool
def spin() -> str:
    """Loop forever, as a tool with a bug in its loop condition would (sleeping a little, to spare the test machine)."""
    while True:
        time.sleep(0.01)


@tool
def echo(text: str) -> str:
    """Return ``text``."""
    return text
