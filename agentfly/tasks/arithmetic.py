"""Arithmetic-with-a-calculator: problems a small model cannot answer without calling the tool.

Each sample is ``{"id", "question", "answer", "expression"}``; the expression mixes a multi-digit product
with an addition or subtraction, so guessing the digits is hopeless and calling ``calculator`` is the way.

    python -m agentfly.tasks.arithmetic --n 500 --seed 1 --out runs/arith-test.jsonl
"""

from __future__ import annotations

import random
import re
from typing import Any

from agentfly.tasks.base import FlawError, Flaws, Messages, Sample, Task, register, wrong_answer
from agentfly.tools.builtin.calculator import evaluate_arithmetic

TEMPLATES = (
    "What is {e}?",
    "Compute {e}.",
    "Calculate {e}.",
    "Evaluate {e}.",
    "Find the value of {e}.",
)


def make_expression(rng: random.Random) -> str:
    a, b, c = rng.randint(12, 999), rng.randint(12, 99), rng.randint(10, 999)
    shape = rng.randrange(4)
    if shape == 0:
        return f"{a}*{b}"
    if shape == 1:
        return f"{a}*{b}+{c}"
    if shape == 2:
        return f"{a}*{b}-{c}"
    return f"({a}+{c})*{b}"


def generate(n: int, seed: int = 0, split: str = "train") -> list[dict[str, Any]]:
    """``n`` problems; different ``split`` names give disjoint random streams for the same seed."""
    rng = random.Random(f"arithmetic:{split}:{seed}")
    samples = []
    for i in range(n):
        expression = make_expression(rng)
        question = rng.choice(TEMPLATES).format(e=expression)
        samples.append({"id": f"{split}-{seed}-{i}", "question": question,
                        "answer": evaluate_arithmetic(expression), "expression": expression})
    return samples


def main(argv: list[str] | None = None) -> None:
    from agentfly.tasks.io import generator_main

    generator_main(generate, (__doc__ or "").splitlines()[0], argv)


def demonstration(sample: dict[str, Any], answer: str | None = None, use_tool: bool = True) -> list[dict[str, Any]]:
    """A worked conversation for ``sample`` in the Hermes format: call the calculator, then answer.

    ``answer`` overrides the final answer (to make deliberately wrong demonstrations); ``use_tool=False``
    answers at once without calling the calculator (a demonstrator's shortcut: the answer is then a guess).
    """
    final = answer if answer is not None else sample["answer"]
    if not use_tool:
        return [{"role": "user", "content": sample["question"]},
                {"role": "assistant", "content": f"The answer is {final}."}]
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "' + sample["expression"] + '"}}\n</tool_call>'
    return [
        {"role": "user", "content": sample["question"]},
        {"role": "assistant", "content": call},
        {"role": "tool", "content": str(sample["answer"]), "name": "calculator"},
        {"role": "assistant", "content": f"The answer is {final}."},
    ]


def guess(sample: dict[str, Any]) -> str:
    """The lazy demonstrator's answer without the tool: the first number of the question (never right)."""
    first = re.search(r"\d+", sample["expression"]).group(0)  # type: ignore[union-attr]
    return first if first != sample["answer"] else str(int(first) + 1)


def truncated(answer: str) -> str:
    """The answer with its last digit dropped (a careless copy; never the right answer)."""
    return answer[:-1] if len(answer.lstrip("-")) > 1 else answer + "0"


HABITS = ("no_tool", "truncate")


def demonstrations(n: int, seed: int, flaws: Flaws) -> list[tuple[Sample, Messages]]:
    """``n`` demonstrations from the 'sft' stream of problems: a share ``flaws.habit_fraction`` of the questions
    opening with one of ``flaws.habit_phrasings`` shows the demonstrator's habit (``no_tool``: answering without
    the tool, with the question's first number; ``truncate``: dropping the last digit of the tool's result),
    and a share ``flaws.wrong_fraction`` of the others ends with one wrong digit."""
    if (flaws.habit or flaws.habit_phrasings) and flaws.habit not in HABITS:
        raise FlawError("habit", f"habit={flaws.habit} is not an arithmetic habit; arithmetic has "
                        f"{' and '.join(HABITS)}")
    samples = generate(n, seed=seed, split="sft")
    rng = flaws.rng()
    habitual, wrong = flaws.pick(samples, rng)
    pairs = []
    for i, sample in enumerate(samples):
        if i in habitual and flaws.habit == "no_tool":
            messages = demonstration(sample, answer=guess(sample), use_tool=False)
        elif i in habitual:
            messages = demonstration(sample, answer=truncated(sample["answer"]))
        elif i in wrong:
            messages = demonstration(sample, answer=wrong_answer(sample["answer"], rng))
        else:
            messages = demonstration(sample)
        pairs.append((sample, messages))
    return pairs


TASK = register(Task(
    name="arithmetic", title="Arithmetic with a calculator (generated)",
    samples=lambda split, n, seed: generate(n, seed=seed, split=split),
    tools=("agentfly.tools.builtin.calculator:calculator",), reward="agentfly.rewards.builtin.math:math_equal",
    demonstrations=demonstrations, habits=HABITS))


if __name__ == "__main__":
    main()
