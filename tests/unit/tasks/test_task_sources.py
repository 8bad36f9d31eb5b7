"""Task sources: a ``data.task`` names a reasoning-gym dataset, a TextWorld theme or a user's module, with
``data.options``, from YAML as from Python; each bad option is refused on its own key, saying how to fix it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from agentfly.rewards.builtin.reasoning_gym import rg_score
from agentfly.tasks import (
    Flaws,
    Task,
    TaskOptionError,
    UnknownTask,
    find_task,
    get_task,
    is_task_name,
    source_of,
)
from trainer.builders import load_samples
from trainer.config import ConfigError, load_config
from trainer.sft import demonstration_conversations


def config(tmp_path: Path, text: str, *overrides: str) -> Any:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return load_config(path, list(overrides))


def test_a_reasoning_gym_dataset_from_yaml_gives_held_out_questions_its_train_split_never_asks(tmp_path: Path) -> None:
    cfg = config(tmp_path, "data: {task: 'reasoning_gym:basic_arithmetic', options: {max_terms: 3}, train_size: 200, "
                           "eval_size: 40}\n")
    train, held_out = load_samples(cfg)
    assert len(train) == 200 and len(held_out) == 40
    assert not {s["question"] for s in held_out} & {s["question"] for s in train}
    assert all(s["rg_entry"]["metadata"]["num_terms"] <= 3 for s in train)
    assert load_samples(cfg)[0] == train  # the same seed, the same samples


def test_the_dataset_s_own_scorer_is_the_reward() -> None:
    [sample] = get_task("reasoning_gym:basic_arithmetic", {"max_terms": 2}).samples("test", 1, 0)
    fields = {k: sample[k] for k in ("rg_dataset", "rg_entry", "rg_options")}
    assert rg_score.fn(f"The answer is {sample['answer']}.", **fields) == 1.0
    assert rg_score.fn(f"<answer>{sample['answer']}</answer>", **fields) == 1.0
    assert rg_score.fn("The answer is 123456789.", **fields) == 0.0
    assert rg_score.fn(None, **fields) == 0.0


@pytest.mark.parametrize(("task", "options", "key", "words"), [
    ("reasoning_gym:basic_arithmetic", {"max_term": 3}, "data.options.max_term", "has no option 'max_term'"),
    ("reasoning_gym:basic_arithmetic", {"min_terms": 9}, "data.options.min_terms", "max_terms must be >= min_terms"),
    ("reasoning_gym:basic_arithmetic", {"seed": 3}, "data.options.seed", "set data.seed instead"),
    ("textworld:custom", {"rooms": [4, 2]}, "data.options.rooms", "low <= high"),
    ("textworld:custom", {"room": 2}, "data.options.room", "its options are rooms"),
    ("textworld:cooking", {"go": 5}, "data.options.go", "choose one of 1, 6, 9, 12"),
    ("arithmetic", {"size": 3}, "data.options.size", "takes no options"),
])
def test_a_bad_option_is_refused_on_its_own_key_saying_how_to_fix_it(tmp_path: Path, task: str, options: dict[str, Any],
                                                                   key: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as caught:
        config(tmp_path, "data: {}\n", f"data.task={task}", f"data.options={options}")
    assert caught.value.key == key


def test_an_unknown_dataset_or_theme_names_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="it has ab, acre") as caught:
        config(tmp_path, "data: {task: 'reasoning_gym:nonesuch'}\n")
    assert caught.value.key == "data.task"
    with pytest.raises(ConfigError, match="its themes are custom, cooking"):
        config(tmp_path, "data: {task: 'textworld:castle'}\n")


def test_textworld_games_are_drawn_per_seed_within_the_ranges_and_held_out_games_are_other_games() -> None:
    task = get_task("textworld:custom", {"rooms": [2, 4], "quest_length": [1, 3]})
    train, test = task.samples("train", 50, 0), task.samples("test", 20, 0)
    assert all(2 <= s["game"]["params"]["rooms"] <= 4 and 1 <= s["game"]["params"]["quest_length"] <= 3 for s in train)
    assert len({s["game"]["params"]["rooms"] for s in train}) > 1
    assert not {s["game"]["seed"] for s in test} & {s["game"]["seed"] for s in train}
    assert task.samples("train", 50, 0) == train and task.samples("train", 50, 1) != train


MODULE = '''
from agentfly.tasks import Task

def count(n):
    return [{"id": f"c{i}", "question": f"Say {i}.", "answer": str(i)} for i in range(n)]

numbers = Task(name="numbers", title="Say a number", samples=lambda split, n, seed: count(n),
               tools=(), reward="agentfly.rewards.builtin.math:math_equal")

def numbers_up_to(limit):
    return Task(name="numbers_up_to", title="Say a number", samples=lambda split, n, seed: count(min(n, limit)),
                tools=(), reward="agentfly.rewards.builtin.math:math_equal")
'''


def test_a_task_named_as_module_and_attribute_in_yaml_is_imported_and_a_factory_takes_the_options(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_tasks.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_tasks", raising=False)
    train, held_out = load_samples(config(tmp_path, "data: {task: 'my_tasks:numbers', train_size: 5, eval_size: 2}\n"))
    assert [s["answer"] for s in train] == ["0", "1", "2", "3", "4"] and len(held_out) == 2
    train, _ = load_samples(config(tmp_path, "data: {task: 'my_tasks:numbers_up_to', options: {limit: 3}}\n"))
    assert len(train) == 3
    with pytest.raises(ConfigError, match=r"did not take data\.options") as caught:
        load_samples(config(tmp_path, "data: {task: 'my_tasks:numbers_up_to', options: {limt: 3}}\n"))
    assert caught.value.key == "data.options"
    with pytest.raises(UnknownTask, match="has no attribute 'nothing'"):
        find_task("my_tasks:nothing")


def test_a_path_with_a_colon_is_still_a_file_of_samples_and_a_source_name_is_a_task() -> None:
    assert source_of("runs/data:v2.jsonl") is None and not is_task_name("runs/data:v2.jsonl")
    assert source_of("reasoning_gym:chain_sum") == "reasoning_gym" and source_of("pkg.mod:attr") == "module"
    assert is_task_name("arithmetic") and find_task("runs/x.jsonl") is None


def test_reasoning_gym_demonstrations_call_the_calculator_with_a_share_wrong_and_the_habit_on_its_phrasings() -> None:
    task = get_task("reasoning_gym:basic_arithmetic", {"max_terms": 3})
    pairs = task.demonstrations(40, 0, Flaws(wrong_fraction=0.25, habit="no_tool", habit_phrasings=("Calculate",),
                                             habit_fraction=0.5, seed=1))
    with_tool = [m for _, m in pairs if len(m) == 4]
    assert with_tool and all('"name": "calculator"' in m[1]["content"] for m in with_tool)
    wrong = [s for s, m in pairs if m[-1]["content"] != f"The answer is {s['answer']}."]
    assert 8 <= len(wrong) <= 30
    assert isinstance(task, Task) and task.habits == ("no_tool",)
    with pytest.raises(Exception, match="not a reasoning_gym habit"):
        task.demonstrations(4, 0, Flaws(habit="truncate", habit_phrasings=("Calculate",), habit_fraction=1.0))


def test_sft_generates_a_source_task_s_demonstrations_from_the_config(tmp_path: Path) -> None:
    cfg = config(tmp_path, "data: {task: 'reasoning_gym:chain_sum'}\nsft: {num_demos: 6}\n")
    assert len(demonstration_conversations(cfg)) == 6


def test_a_task_option_error_names_its_option() -> None:
    with pytest.raises(TaskOptionError) as caught:
        find_task("reasoning_gym:chain_sum", {"bogus": 1})
    assert caught.value.option == "bogus"
