"""A team plugin module, registered by the tests from the AGENTFLY_PLUGIN_DIRS folder."""

from typing import Any

from agentfly.rewards import reward
from agentfly.tools import tool

NOT_A_TOOL = 42


@tool
def word_count(text: str) -> int:
    """Count the words in a text.

    Args:
        text: The text whose whitespace-separated words are counted.
    """
    return len(text.split())


def shout(text: str) -> str:
    """Upper-case a text (a plain function: the registry refuses it until it is decorated)."""
    return text.upper()


@reward
def length_penalty(final_answer: str | None) -> float:
    """1 for a short answer, 0 for a long or missing one."""
    return 1.0 if final_answer and len(final_answer) < 20 else 0.0


@reward
async def same_answer_in_a_sandbox(final_answer: str | None, answer: str, context: Any) -> float:
    """1 when the final answer is the reference answer, compared in the rollout's "python" sandbox: a reward
    that leases a pooled resource on every rollout, whatever the model writes."""
    box = await context.resource("python")
    printed = await box.run(f"print({(final_answer or '').strip()!r} == {str(answer).strip()!r})")
    return 1.0 if printed.strip() == "True" else 0.0


@reward
def lookup_answer(final_answer: str | None, answer: str) -> float:
    """A reward with a bug: it reads a key its table does not have, so it raises KeyError on every call."""
    table = {"k1": answer}
    return float(final_answer == table["start"])


@tool
def city_weather(day: str, context: Any) -> str:
    """The weather of the task sample's city on a day.

    Args:
        day: The day, e.g. monday.
    """
    return f"sunny in {context.sample['city']} on {day}"
