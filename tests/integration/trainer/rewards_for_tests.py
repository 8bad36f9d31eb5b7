"""A reward that varies on an untrained model's noise, so tests see non-zero advantages and real updates."""

from __future__ import annotations

from typing import Any

from agentfly.rewards import reward


@reward
def answer_length(final_answer: str | None) -> float:
    """Longer final answers score higher (capped at 1): a dense signal for loop tests, not a task."""
    return min(len(final_answer or "") / 40.0, 1.0)


@reward
def calculator_use(final_answer: str | None, trajectory: Any) -> float:
    """Half for asking the calculator (a tool call, parsed or not), half for the answer's length (capped): dense
    enough that the rollouts of one prompt differ, so GRPO's advantages are not all zero."""
    return 0.5 * bool(trajectory.tool_calls) + 0.5 * min(len(final_answer or "") / 40.0, 1.0)
