"""Rewards graded by a judge model (the ``judge`` resource, ``agentfly.resources.judge``).

``rubric_judge`` asks the judge to grade the final answer against the sample's ``rubric``, else the judge's
own (a job's rubric, ``judge_spec(rubric=...)``), else a general one; ``preference_vs_reference`` asks which
of the final answer and the sample's ``reference`` answer is better, by the same rubric when one is given. A judge reply that cannot be parsed raises: the trajectory records the error and the judge counts it.
"""

from __future__ import annotations

from typing import Any

from agentfly.rewards.reward import reward


@reward(resource="judge")
async def rubric_judge(final_answer: str | None, question: str, context: Any, rubric: str | None = None,
                       reference: str | None = None) -> float:
    """The judge's grade of the final answer on the rubric, in 0..1 (no answer scores 0 without asking)."""
    if not final_answer:
        return 0.0
    judge = await context.resource("judge")
    return float(await judge.score(question=question, answer=final_answer, rubric=rubric, reference=reference))


@reward(resource="judge")
async def preference_vs_reference(final_answer: str | None, question: str, reference: str, context: Any,
                                  rubric: str | None = None) -> float:
    """1 when the judge prefers the final answer to the reference answer, 0.5 for a tie, 0 otherwise
    (the pair is shown both ways round and the verdicts averaged)."""
    if not final_answer:
        return 0.0
    judge = await context.resource("judge")
    return float(await judge.compare(question=question, answer=final_answer, reference=reference, rubric=rubric))
