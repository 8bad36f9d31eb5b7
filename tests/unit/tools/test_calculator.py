"""The built-in ``calculator`` tool: exact arithmetic, parsed with ``ast``, never ``eval``."""

from __future__ import annotations

import pytest

from agentfly.tools.builtin import calculator, evaluate_arithmetic


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("37*48", "1776"),
        ("(123+877)*45", "45000"),
        ("968*71-512", "68216"),
        ("-3 + +4", "1"),
        ("2^10", "1024"),
        ("2**-2", "0.25"),
        ("1/3", "0.333333"),
        ("6/3", "2"),
        ("0.1+0.2", "0.3"),  # exact rationals, not binary floats
        ("17//5", "3"),
        ("17%5", "2"),
        ("6×7÷2", "21"),
    ],
)
def test_it_evaluates_arithmetic_exactly(expression: str, value: str) -> None:
    assert evaluate_arithmetic(expression) == value


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ("__import__('os').system('true')", "unsupported syntax"),
        ("open('/etc/passwd')", "unsupported syntax"),
        ("x + 1", "unsupported syntax"),
        ("'a' * 3", "unsupported syntax"),
        ("[1, 2]", "unsupported syntax"),
        ("1 < 2", "unsupported syntax"),
        ("2 ** 1000", "exponent must be an integer of at most 100"),
        ("2 ** 0.5", "exponent must be an integer"),
        ("1 +", "cannot parse"),
        ("1" * 201, "longer than 200 characters"),
    ],
)
def test_it_rejects_anything_but_bounded_arithmetic(expression: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        evaluate_arithmetic(expression)


@pytest.mark.parametrize("expression", ["1/0", "5//0", "5%0"])
def test_it_rejects_division_by_zero(expression: str) -> None:
    with pytest.raises(ZeroDivisionError):
        evaluate_arithmetic(expression)


def test_it_is_a_tool_with_a_documented_schema() -> None:
    assert calculator.schema == {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {
                    "type": "string",
                    "description": 'Arithmetic with + - * / ( ) and integers, e.g. "37*48".',
                }},
                "required": ["expression"],
            },
        },
    }
    assert calculator.timeout == 5


async def test_it_answers_the_model_and_reports_bad_expressions_as_observations() -> None:
    assert (await calculator.invoke({"expression": "37*48"})).observation == "1776"
    bad = await calculator.invoke({"expression": "1/0"})
    assert bad.observation == "Error: tool 'calculator' raised ZeroDivisionError: division by zero"
    unsafe = await calculator.invoke({"expression": "__import__('os')"})
    assert unsafe.error is not None and "unsupported syntax" in unsafe.error
    missing = await calculator.invoke({"expr": "1"})
    assert missing.error is not None and "expression: Field required" in missing.error
