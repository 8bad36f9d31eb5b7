"""``@reward``: inputs bound by name, float or dict results, sync or async, failures recorded not raised."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentfly.rewards import Reward, RewardError, RewardResult, reward

SAMPLE = {"question": "What is 2+2?", "answer": "4", "tests": ["assert f() == 4"]}


async def score(r: Reward, final_answer: str | None = "4", trajectory: Any = "TRAJ", context: Any = "CTX",
                sample: dict[str, Any] | None = None) -> RewardResult:
    return await r.score(final_answer, trajectory, context, SAMPLE if sample is None else sample)


async def test_it_binds_inputs_by_name_from_the_runtime_and_the_sample() -> None:
    seen: dict[str, Any] = {}

    @reward
    def judge(final_answer: str, answer: str, trajectory: Any, context: Any, tests: list[str]) -> float:
        seen.update(final_answer=final_answer, answer=answer, trajectory=trajectory, context=context, tests=tests)
        return 1.0

    result = await score(judge)
    assert result == RewardResult(1.0, {}, None)
    assert seen == {"final_answer": "4", "answer": "4", "trajectory": "TRAJ", "context": "CTX",
                    "tests": ["assert f() == 4"]}


async def test_it_passes_only_the_inputs_a_reward_declares() -> None:
    @reward
    def only_answer(answer: str) -> float:
        return float(answer == "4")

    assert (await score(only_answer)).reward == 1.0


async def test_it_passes_everything_to_a_reward_taking_kwargs() -> None:
    seen: dict[str, Any] = {}

    @reward
    def everything(**inputs: Any) -> float:
        seen.update(inputs)
        return 0.5

    assert (await score(everything)).reward == 0.5
    assert set(seen) == {"question", "answer", "tests", "final_answer", "trajectory", "context"}


async def test_it_uses_defaults_for_optional_inputs_the_sample_lacks() -> None:
    @reward
    def with_default(final_answer: str, tolerance: float = 0.25, answer: str = "?") -> float:
        return tolerance if answer == "4" else -1.0

    assert (await score(with_default)).reward == 0.25
    assert (await score(with_default, sample={"question": "q"})).reward == -1.0


def test_it_names_a_missing_sample_field_and_the_fix() -> None:
    @reward
    def needs_gold(final_answer: str, gold: str, label: int) -> float:
        return 0.0

    with pytest.raises(RewardError) as err:
        needs_gold.check_sample(SAMPLE)
    message = str(err.value)
    assert "'gold'" in message and "'label'" in message and "needs_gold" in message
    assert "['answer', 'question', 'tests']" in message
    assert "default" in message  # says how to fix it


async def test_it_returns_metrics_from_a_dict_result() -> None:
    @reward
    def detailed(final_answer: str) -> dict[str, Any]:
        return {"reward": 0.75, "format": 1, "length": 12.5, "note": "ignored, not a number"}

    assert await score(detailed) == RewardResult(0.75, {"format": 1.0, "length": 12.5}, None)


async def test_it_accepts_ints_and_bools_as_rewards() -> None:
    @reward
    def as_bool(answer: str) -> bool:
        return True

    @reward
    def as_int(answer: str) -> int:
        return 3

    assert (await score(as_bool)).reward == 1.0
    assert (await score(as_int)).reward == 3.0


async def test_it_awaits_async_rewards() -> None:
    @reward
    async def slow(final_answer: str, answer: str) -> float:
        await asyncio.sleep(0.01)
        return float(final_answer == answer)

    assert slow.is_async
    assert (await score(slow)).reward == 1.0
    assert (await score(slow, final_answer="5")).reward == 0.0


@pytest.mark.parametrize(
    ("returned", "why"),
    [({"score": 1.0}, "without a 'reward' key"), ("1.0", "returned str"), (None, "returned NoneType")],
)
async def test_it_records_an_unusable_result_as_an_error_with_reward_zero(returned: Any, why: str) -> None:
    @reward
    def odd(answer: str) -> Any:
        return returned

    result = await score(odd)
    assert result.reward == 0.0
    assert result.error is not None and why in result.error


async def test_it_records_sync_and_async_exceptions_with_reward_zero() -> None:
    @reward
    def crashes(answer: str) -> float:
        raise ZeroDivisionError("boom")

    @reward
    async def crashes_async(answer: str) -> float:
        raise RuntimeError("async boom")

    for fn, error, kind in ((crashes, "reward 'crashes' raised ZeroDivisionError: boom", "ZeroDivisionError"),
                            (crashes_async, "reward 'crashes_async' raised RuntimeError: async boom", "RuntimeError")):
        result = await score(fn)
        assert (result.reward, result.metrics, result.error) == (0.0, {}, error)
        assert result.traceback is not None and f"{kind}: " in result.traceback  # where it raised, for the fix


async def test_it_records_a_missing_field_at_scoring_time_too() -> None:
    @reward
    def needs_gold(gold: str) -> float:
        return 1.0

    result = await score(needs_gold)
    assert result.reward == 0.0 and result.error is not None and "'gold'" in result.error


def test_it_takes_a_name_and_rejects_star_args() -> None:
    @reward(name="accuracy")
    def acc(answer: str) -> float:
        return 1.0

    assert acc.name == "accuracy" and acc.required == ("answer",)
    assert acc("4") == 1.0  # still callable like the function

    def spread(*values: Any) -> float:
        return 0.0

    with pytest.raises(RewardError, match=r"\*values"):
        reward(spread)
