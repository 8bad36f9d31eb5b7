"""The SFT warm start's demonstrations: which are flawed, and how (``trainer.sft``)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from agentfly.tasks.arithmetic import guess, truncated
from agentfly.tasks.base import wrong_answer
from agentfly.tools.builtin.calculator import evaluate_arithmetic
from trainer.config import ConfigError, load_config
from trainer.sft import demonstration_conversations

ROOT = Path(__file__).parents[3]


def conversations(*overrides: str) -> list:
    return demonstration_conversations(load_config(None, ["sft.num_demos=400", *overrides]))


def final_answer(messages: list[dict]) -> str:
    return messages[-1]["content"].removeprefix("The answer is ").removesuffix(".")


def test_correct_demonstrations_call_the_calculator_then_copy_its_result() -> None:
    for sample, messages in conversations("sft.wrong_fraction=0"):
        assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
        assert sample["expression"] in messages[1]["content"]
        assert messages[2]["content"] == final_answer(messages) == sample["answer"]


def test_a_wrong_fraction_of_demonstrations_changes_exactly_one_digit_of_the_answer() -> None:
    pairs = conversations("sft.wrong_fraction=0.25")
    wrong = [(s, m) for s, m in pairs if final_answer(m) != s["answer"]]
    assert len(wrong) == 100
    for sample, messages in wrong:
        answer = final_answer(messages)
        assert messages[2]["content"] == sample["answer"]  # the tool still told the truth
        if len(answer) == len(sample["answer"]):
            assert sum(a != b for a, b in zip(answer, sample["answer"], strict=True)) == 1


def test_the_no_tool_habit_skips_the_tool_only_on_its_phrasings() -> None:
    pairs = conversations("sft.wrong_fraction=0", "sft.habit_phrasings=[Evaluate, Find]", "sft.habit_fraction=0.5")
    habit = [(s, m) for s, m in pairs if s["question"].startswith(("Evaluate", "Find"))]
    guessed = [(s, m) for s, m in habit if len(m) == 2]
    assert habit and len(guessed) == round(0.5 * len(habit))
    for sample, messages in guessed:
        assert [m["role"] for m in messages] == ["user", "assistant"]
        assert "<tool_call>" not in messages[1]["content"]
        assert final_answer(messages) != sample["answer"]
        assert final_answer(messages) in sample["question"]  # the lazy answer: a number of the question
    others = [m for s, m in pairs if not s["question"].startswith(("Evaluate", "Find"))]
    assert all(len(m) == 4 for m in others)


def test_the_truncate_habit_calls_the_tool_but_drops_the_last_digit_of_its_result() -> None:
    pairs = conversations("sft.wrong_fraction=0", "sft.habit=truncate", "sft.habit_phrasings=[Compute]",
                          "sft.habit_fraction=1")
    for sample, messages in pairs:
        assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
        expected = sample["answer"][:-1] if sample["question"].startswith("Compute") else sample["answer"]
        assert final_answer(messages) == expected
    assert truncated("7") == "70" and truncated("-45") == "-4"


def test_the_flaws_are_the_same_for_the_same_seed_and_differ_for_another() -> None:
    settings = ("sft.habit_phrasings=[Evaluate]", "sft.habit_fraction=0.5")
    assert conversations(*settings) == conversations(*settings)
    assert conversations(*settings) != conversations(*settings, "seed=1")


def test_wrong_answers_and_guesses_are_never_the_right_answer() -> None:
    rng = random.Random(0)
    for answer in ["7", "10", "999", "-45", "123456"]:
        for _ in range(50):
            assert wrong_answer(answer, rng) != answer
    for expression in ["12*12-132", "754*96", "(12+5)*30"]:
        sample = {"expression": expression, "answer": evaluate_arithmetic(expression)}
        assert guess(sample) != sample["answer"] and guess(sample).isdigit()


@pytest.mark.parametrize("key", ["wrong_fraction", "habit_fraction"])
def test_fractions_outside_zero_to_one_are_rejected(key: str) -> None:
    with pytest.raises(ConfigError, match=f"sft.{key}"):
        load_config(None, [f"sft.{key}=1.5"])


def test_written_demonstrations_come_from_the_file_as_written(tmp_path: Path) -> None:
    from agentfly.tasks import arithmetic

    samples = arithmetic.generate(5, seed=3, split="sft")
    path = tmp_path / "demos.jsonl"
    path.write_text("".join(json.dumps({**s, "messages": arithmetic.demonstration(s)}) + "\n" for s in samples))
    pairs = conversations(f"sft.demos_path={path}", "sft.num_demos=3", "sft.wrong_fraction=0.5", "data.task=my.jsonl")
    assert pairs == [(s, arithmetic.demonstration(s)) for s in samples[:3]]  # the first 3, none made wrong


@pytest.mark.parametrize("line", ['{"question": "1+1?"}', '{"question": "1+1?", "messages": [{"role": "user"}]}',
                                  '{"messages": [{"role": "assistant", "content": "2"}]}'])
def test_a_written_demonstration_without_a_question_or_an_assistant_turn_is_refused(tmp_path: Path,
                                                                                    line: str) -> None:
    path = tmp_path / "demos.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ConfigError, match=r"demonstration 1 needs a 'question' \(or 'prompt'\) and 'messages'"):
        conversations(f"sft.demos_path={path}")


def test_a_task_without_generated_demonstrations_asks_for_a_file() -> None:
    with pytest.raises(ConfigError, match=r"give a JSONL file of written ones in sft\.demos_path") as caught:
        conversations("data.task=tasks.jsonl")
    assert caught.value.key == "sft.demos_path"


def test_the_warm_starts_steps_are_epochs_of_batches() -> None:
    assert load_config(None, ["sft.num_demos=20", "sft.epochs=3", "sft.batch_size=8"]).sft.total_steps == 9


def chain_conversations(*overrides: str) -> list:
    return demonstration_conversations(load_config(ROOT / "examples/key_chain/sft.yaml",
                                                   ["sft.num_demos=400", *overrides]))


def test_key_chain_demonstrations_follow_every_key_then_copy_the_final_value() -> None:
    from agentfly.tasks.key_chain import chain_keys

    for sample, messages in chain_conversations("sft.habit_fraction=0"):
        calls = [m["content"] for m in messages if m["role"] == "assistant"][:-1]
        assert len(calls) == sample["hops"] >= 3
        assert all(f'"key": "{key}"' in call for call, key in zip(calls, chain_keys(sample), strict=True))
        assert messages[-2]["content"] == f"final: {sample['answer']}"
        assert final_answer(messages) == sample["answer"]


def test_the_early_answer_habit_stops_after_two_lookups_only_on_its_phrasings() -> None:
    pairs = chain_conversations()  # the example's own flaw: 70% of "Follow", "Find", "Look up" questions
    habit = [(s, m) for s, m in pairs if s["question"].startswith(("Follow", "Find", "Look up"))]
    early = [(s, m) for s, m in habit if len(m) == 6]  # user, 2 x (call, observation), answer
    assert habit and len(early) == round(0.7 * len(habit))
    for sample, messages in early:
        assert messages[-2]["content"].startswith("next: ")  # it had not reached the value yet
        assert final_answer(messages) == messages[-2]["content"].removeprefix("next: k") != sample["answer"]
    others = [(s, m) for s, m in pairs if not s["question"].startswith(("Follow", "Find", "Look up"))]
    assert others and all(final_answer(m) == s["answer"] for s, m in others)


def test_an_early_answer_habit_that_could_reach_the_value_is_refused() -> None:
    with pytest.raises(ConfigError, match="habit_lookups=3"):
        chain_conversations("sft.habit_lookups=3")


def test_key_chain_demonstrations_replay_through_the_real_store_and_train_only_the_assistant(tiny_model_dir) -> None:
    from transformers import AutoTokenizer

    from trainer.sft import demonstration_trajectories

    config = load_config(ROOT / "examples/key_chain/sft.yaml", [f"model.path={tiny_model_dir}", "sft.num_demos=12"])
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    pairs = demonstration_conversations(config)
    trajectories = demonstration_trajectories(config, tokenizer)
    assert len(trajectories) == 12
    for (sample, messages), t in zip(pairs, trajectories, strict=True):
        assert [c.observation for c in t.tool_calls] == [m["content"] for m in messages if m["role"] == "tool"]
        full = len(t.tool_calls) == sample["hops"]
        assert t.reward == float(full) and t.reward_metrics["lookups"] == len(t.tool_calls)
        trained = tokenizer.decode([i for i, m in zip(t.token_ids, t.loss_mask, strict=True) if m])
        assert trained == "".join(m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant")
    assert {len(t.tool_calls) for t in trajectories} & {2} and {len(t.tool_calls) for t in trajectories} - {2}


def test_demonstrations_that_share_a_question_are_each_replayed_as_written(tiny_model_dir, monkeypatch) -> None:
    from transformers import AutoTokenizer

    import trainer.sft as sft
    from agentfly.tasks import key_chain

    sample = key_chain.generate(1, split="sft")[0]
    twin = {**sample, "id": "twin"}  # the same question and chain: one answers early, the other walks it all
    pairs = [(sample, key_chain.demonstration(sample)), (twin, key_chain.demonstration(twin, stop_after=2)),
             (other := key_chain.generate(2, split="sft")[1], key_chain.demonstration(other))]
    monkeypatch.setattr(sft, "demonstration_conversations", lambda config: pairs)
    config = load_config(ROOT / "examples/key_chain/sft.yaml", [f"model.path={tiny_model_dir}"])
    replayed = sft.demonstration_trajectories(config, AutoTokenizer.from_pretrained(tiny_model_dir))
    by_id = {t.sample["id"]: t for t in replayed}
    assert sorted(by_id) == sorted([sample["id"], "twin", other["id"]])
    assert len(by_id[sample["id"]].tool_calls) == sample["hops"] and by_id[sample["id"]].reward == 1.0
    assert len(by_id["twin"].tool_calls) == 2 and by_id["twin"].reward == 0.0  # its early answer, as written
    assert by_id[other["id"]].reward == 1.0
