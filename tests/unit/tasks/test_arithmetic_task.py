"""The arithmetic task: seeded, split-separated, answerable only with the calculator, stored as JSONL."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agentfly.tasks import arithmetic, load_jsonl, save_jsonl
from agentfly.tools.builtin import evaluate_arithmetic


def test_it_is_reproducible_for_a_seed_and_differs_across_seeds_and_splits() -> None:
    first = arithmetic.generate(50, seed=3)
    assert first == arithmetic.generate(50, seed=3)
    other_seed = {s["question"] for s in arithmetic.generate(50, seed=4)}
    other_split = {s["question"] for s in arithmetic.generate(50, seed=3, split="test")}
    questions = {s["question"] for s in first}
    assert len(questions & other_seed) < 5 and len(questions & other_split) < 5


def test_its_samples_carry_a_question_an_exact_answer_and_the_expression() -> None:
    for i, sample in enumerate(arithmetic.generate(200, seed=0)):
        assert set(sample) == {"id", "question", "answer", "expression"}
        assert sample["id"] == f"train-0-{i}"
        assert sample["expression"] in sample["question"]
        assert sample["answer"] == evaluate_arithmetic(sample["expression"])
        assert re.fullmatch(r"-?\d+", sample["answer"])


def test_its_answers_are_too_long_to_guess() -> None:
    answers = [s["answer"] for s in arithmetic.generate(300, seed=1)]
    assert all(len(a.lstrip("-")) >= 3 for a in answers)
    assert sum(len(a) >= 4 for a in answers) > 0.8 * len(answers)
    assert len(set(answers)) > 0.9 * len(answers)


def test_it_writes_a_demonstration_that_calls_the_calculator_then_answers() -> None:
    sample = arithmetic.generate(1, seed=0)[0]
    messages = arithmetic.demonstration(sample)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    call = re.fullmatch(r"<tool_call>\n(.*)\n</tool_call>", messages[1]["content"], re.S)
    assert call and json.loads(call.group(1)) == {"name": "calculator",
                                                   "arguments": {"expression": sample["expression"]}}
    assert messages[2]["content"] == sample["answer"]
    assert messages[3]["content"] == f"The answer is {sample['answer']}."
    assert arithmetic.demonstration(sample, answer="0")[3]["content"] == "The answer is 0."


def test_it_round_trips_through_jsonl(tmp_path: Path) -> None:
    samples = arithmetic.generate(20, seed=2)
    path = save_jsonl(samples, tmp_path / "nested" / "arith.jsonl")
    assert len(path.read_text().splitlines()) == 20
    assert load_jsonl(path) == samples


def test_its_command_line_writes_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "a.jsonl"
    arithmetic.main(["--n", "7", "--seed", "5", "--split", "dev", "--out", str(out)])
    assert load_jsonl(out) == arithmetic.generate(7, seed=5, split="dev")
    assert str(out) in capsys.readouterr().out


@pytest.mark.parametrize(
    ("content", "error"),
    [('{"question": "q"}\nnot json\n', r"a\.jsonl:2: not valid JSON"),
     ('\n["a list"]\n', r"a\.jsonl:2: each line must be a JSON object, got list")],
)
def test_it_names_the_file_and_line_of_malformed_jsonl(tmp_path: Path, content: str, error: str) -> None:
    (tmp_path / "a.jsonl").write_text(content)
    with pytest.raises(ValueError, match=error):
        load_jsonl(tmp_path / "a.jsonl")
