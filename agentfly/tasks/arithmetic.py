"""Arithmetic-with-a-calculator: problems a small model cannot answer without calling the tool.

Each sample is ``{"id", "question", "answer", "expression"}``; the expression mixes a multi-digit product
with an addition or subtraction, so guessing the digits is hopeless and calling ``calculator`` is the way.

    python -m agentfly.tasks.arithmetic --n 500 --seed 1 --out runs/arith-test.jsonl
"""

from __future__ import annotations

import random
from typing import Any

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


if __name__ == "__main__":
    main()
