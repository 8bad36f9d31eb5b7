"""``Tool.invoke``: validated calls, and every failure turned into an error observation for the model."""

from __future__ import annotations

import asyncio
import enum
import threading
import time
from typing import Any

import pydantic
import pytest

from agentfly.tools import ArgumentError, Tool, ToolResult, tool


@tool
def add(a: int, b: int = 1) -> int:
    """Add two integers."""
    return a + b


@tool
async def shout(text: str, times: int = 1) -> str:
    await asyncio.sleep(0)
    return (text.upper() + " ") * times


class Box(pydantic.BaseModel):
    width: int
    height: int


@tool
def box_area(box: Box) -> dict[str, int]:
    return {"area": box.width * box.height}


async def test_it_calls_a_sync_tool_with_validated_arguments() -> None:
    result = await add.invoke({"a": 2, "b": 40})
    assert result == ToolResult("42", None, result.latency)
    assert result.ok and result.latency >= 0


async def test_it_calls_an_async_tool_and_fills_defaults() -> None:
    result = await shout.invoke({"text": "hi"})
    assert result.ok and result.observation == "HI "


async def test_it_renders_non_string_results_as_json() -> None:
    result = await box_area.invoke({"box": {"width": 3, "height": 4}})
    assert result.observation == '{"area": 12}'


async def test_it_renders_pydantic_results_as_their_json() -> None:
    @tool
    def make_box(side: int) -> Box:
        return Box(width=side, height=side)

    assert (await make_box.invoke({"side": 2})).observation == '{"width":2,"height":2}'


async def test_it_keeps_the_tool_callable_like_the_function() -> None:
    assert add(1, 2) == 3
    assert await shout("a", times=2) == "A A "
    assert add.__name__ == "add" and add.__doc__ == "Add two integers."
    assert not add.is_async and shout.is_async


@pytest.mark.parametrize(
    ("arguments", "field", "why"),
    [
        ({"a": "three"}, "a", "valid integer"),
        ({"b": 2}, "a", "Field required"),
        ({"a": 1, "c": 2}, "c", "unexpected argument"),
        ({"a": [1]}, "a", "got [1]"),
    ],
    ids=["wrong-type", "missing", "extra", "echoes-the-bad-value"],
)
async def test_it_turns_bad_arguments_into_an_error_naming_the_field(arguments: dict[str, Any], field: str,
                                                                       why: str) -> None:
    result = await add.invoke(arguments)
    assert not result.ok
    assert result.error is not None and f"{field}: " in result.error and why in result.error
    assert "tool 'add'" in result.error
    assert result.observation == f"Error: {result.error}"


async def test_it_names_nested_fields_of_pydantic_arguments() -> None:
    result = await box_area.invoke({"box": {"width": 3, "height": "tall"}})
    assert result.error is not None and "box.height: " in result.error


async def test_it_reports_every_bad_field_at_once() -> None:
    result = await add.invoke({"a": "x", "b": "y", "zzz": 0})
    assert result.error is not None
    for field in ("a: ", "b: ", "zzz: unexpected argument"):
        assert field in result.error


@pytest.mark.parametrize("arguments", [[1, 2], "a=1", None, 7])
async def test_it_rejects_arguments_that_are_not_a_json_object(arguments: Any) -> None:
    result = await add.invoke(arguments)
    assert result.error is not None and "must be a JSON object" in result.error
    with pytest.raises(ArgumentError):
        add.validate(arguments)


async def test_it_turns_sync_and_async_exceptions_into_error_observations() -> None:
    @tool
    def broken(x: int) -> int:
        raise ValueError(f"cannot handle {x}")

    @tool
    async def broken_async() -> str:
        await asyncio.sleep(0)
        raise KeyError("missing")

    sync_result = await broken.invoke({"x": 3})
    assert sync_result.error == "tool 'broken' raised ValueError: cannot handle 3"
    assert sync_result.observation == "Error: tool 'broken' raised ValueError: cannot handle 3"
    async_result = await broken_async.invoke({})
    assert async_result.error == "tool 'broken_async' raised KeyError: 'missing'"


async def test_it_times_out_a_slow_async_tool_by_cancelling_it() -> None:
    cancelled, finished = asyncio.Event(), asyncio.Event()

    @tool(timeout=0.05)
    async def sleepy() -> str:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        finished.set()
        return "late"

    result = await sleepy.invoke({})
    # Cancelled at the timeout, before invoke returned: neither waited for nor left running.
    assert cancelled.is_set() and not finished.is_set()
    assert result.error == "tool 'sleepy' timed out after 0.05 s"


async def test_it_times_out_a_slow_sync_tool_without_waiting_for_it() -> None:
    # The tool blocks until the test lets it go, which it does only after invoke returned: an invoke that
    # waited for the thread would return after 10 s with the tool finished.
    release, finished = threading.Event(), threading.Event()

    @tool(timeout=0.05)
    def sleepy_sync() -> str:
        release.wait(10)
        finished.set()
        return "late"

    try:
        result = await sleepy_sync.invoke({})
        assert not finished.is_set(), "invoke waited for the abandoned thread"
    finally:
        release.set()
    assert result.error == "tool 'sleepy_sync' timed out after 0.05 s"


async def test_it_runs_sync_tools_in_threads_so_they_overlap() -> None:
    # Each call waits at a barrier for all four: it opens only if the four run at the same time (one at a
    # time, the first would wait out the barrier's timeout and fail).
    together = threading.Barrier(4, timeout=10)

    @tool
    def nap(seconds: float) -> str:
        together.wait()
        time.sleep(seconds)
        return "ok"

    results = await asyncio.gather(*(nap.invoke({"seconds": 0.01}) for _ in range(4)))
    assert [(r.observation, r.error) for r in results] == [("ok", None)] * 4


async def test_it_lets_cancellation_through() -> None:
    @tool(timeout=None)
    async def forever() -> str:
        await asyncio.sleep(60)
        return ""

    task = asyncio.ensure_future(forever.invoke({}))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_it_injects_the_context_into_a_tool_that_asks_for_it() -> None:
    seen: list[Any] = []

    @tool
    async def remember(note: str, context: Any) -> str:
        seen.append(context)
        return f"{note}@{context['id']}"

    result = await remember.invoke({"note": "n"}, context={"id": "r1"})
    assert result.observation == "n@r1"
    assert seen == [{"id": "r1"}]


async def test_it_refuses_a_context_argument_from_the_model() -> None:
    @tool
    def private(context: Any) -> str:
        return str(context)

    result = await private.invoke({"context": "forged"}, context="real")
    assert result.error is not None and "context: unexpected argument" in result.error


async def test_it_takes_name_description_timeout_and_resource_from_the_decorator() -> None:
    @tool(name="python", description="Run Python.", timeout=2.5, resource="sandbox")
    async def run_code(code: str, context: Any) -> str:
        """Docstring summary that the explicit description replaces."""
        return code

    assert isinstance(run_code, Tool)
    assert run_code.name == "python"
    assert run_code.schema["function"]["name"] == "python"
    assert run_code.schema["function"]["description"] == "Run Python."
    assert run_code.timeout == 2.5
    assert run_code.resource == "sandbox"
    assert (await run_code.invoke({"code": "1"}, context=object())).observation == "1"


def test_it_refuses_a_resource_on_a_tool_without_a_context_parameter() -> None:
    with pytest.raises(TypeError, match=r"resource='sandbox'.*'context'"):
        @tool(resource="sandbox")
        def no_context(code: str) -> str:
            return code


def test_it_uses_the_docstring_summary_when_no_description_is_given() -> None:
    @tool(timeout=None)
    def described() -> str:
        """First line.

        Args:
            nothing: there are no arguments.
        """
        return ""

    assert described.description == "First line."
    assert described.timeout is None


class Unit(enum.Enum):
    CM = "cm"
    INCH = "inch"


async def test_it_converts_enum_values_for_the_function() -> None:
    @tool
    def convert(value: float, unit: Unit = Unit.CM) -> str:
        return f"{value:g} {unit.name}"

    assert (await convert.invoke({"value": 2, "unit": "inch"})).observation == "2 INCH"
    bad = await convert.invoke({"value": 2, "unit": "mile"})
    assert bad.error is not None and "unit: " in bad.error
