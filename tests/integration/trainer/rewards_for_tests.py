"""A reward that varies on an untrained model's noise, so tests see non-zero advantages and real updates."""

from __future__ import annotations

from agentfly.rewards import reward


@reward
def answer_length(final_answer: str | None) -> float:
    """Longer final answers score higher (capped at 1): a dense signal for loop tests, not a task."""
    return min(len(final_answer or "") / 40.0, 1.0)
