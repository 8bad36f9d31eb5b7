"""The built-in ``math_equal`` reward: the final answer is extracted, then compared numerically or symbolically."""

from __future__ import annotations

import pytest

from agentfly.rewards.builtin import extract_answer, math_equal


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("The product is <answer> 7 </answer>, not 12.", "7"),
        ("So the result is \\boxed{3/4}.", "3/4"),
        ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("unclosed \\boxed{\\frac{1}{2}", "2"),
        ("First 12, then -1,234.5", "-1,234.5"),
        ("<answer>a</answer> and later <answer>b</answer>", "b"),
        ("no numbers at all  ", "no numbers at all"),
        (None, None),
        ("", None),
    ],
)
def test_it_extracts_the_final_answer(text: str | None, answer: str | None) -> None:
    assert extract_answer(text) == answer


@pytest.mark.parametrize(
    ("final_answer", "answer"),
    [
        ("The answer is 1776.", "1776"),
        ("<answer>1,776</answer>", "1776"),
        ("It is 3.0", "3"),
        ("\\boxed{2/4}", "0.5"),
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("\\boxed{\\sqrt{4}}", "2"),
        ("\\boxed{x+1}", "1+x"),
        ("-68216", "-68216"),
        ("1776", 1776),
    ],
)
async def test_it_scores_equal_answers_one(final_answer: str, answer: str) -> None:
    result = await math_equal.score(final_answer, None, None, {"answer": answer})
    assert (result.reward, result.error) == (1.0, None)


@pytest.mark.parametrize(
    ("final_answer", "answer"),
    [
        ("The answer is 1777.", "1776"),
        ("I used 1776 then got 42", "1776"),  # the last number counts
        ("\\boxed{x+2}", "x+1"),
        ("", "0"),
        (None, "1"),
    ],
)
async def test_it_scores_wrong_or_missing_answers_zero(final_answer: str | None, answer: str) -> None:
    result = await math_equal.score(final_answer, None, None, {"answer": answer})
    assert (result.reward, result.error) == (0.0, None)


def test_it_needs_the_answer_field_of_the_sample() -> None:
    assert math_equal.required == ("final_answer", "answer")
    from agentfly.rewards import RewardError

    with pytest.raises(RewardError, match="'answer'"):
        math_equal.check_sample({"question": "q", "solution": "1"})


def test_it_compares_symbolically_both_on_the_main_thread_and_in_worker_threads() -> None:
    # Rewards run in worker threads, where math-verify's signal-based timeout cannot be used.
    import threading

    seen: list[float] = []
    worker = threading.Thread(target=lambda: seen.append(math_equal("\\boxed{\\frac{2}{4}}", "0.5")))
    worker.start()
    worker.join()
    assert seen == [1.0]
    assert math_equal("\\boxed{2x}", "x*2") == 1.0
