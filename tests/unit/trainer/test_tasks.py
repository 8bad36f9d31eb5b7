"""Tasks carry their own knowledge (``agentfly.tasks``): the trainer, the SFT warm start and the CLI ask the
registry for ``data.task``, so the built-in tasks give what they gave before the registry, and a task defined
here trains without any change to the trainer."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

import pytest

from agentfly.tasks import FlawError, Flaws, Task, UnknownTask, base, get_task, register, task_names, tasks
from trainer.builders import import_object, load_samples
from trainer.config import BUILTIN_TASKS, ConfigError, load_config
from trainer.sft import demonstration_conversations

ROOT = Path(__file__).parents[3]


def fingerprint(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj).encode()).hexdigest()[:16]


# Computed before the tasks moved behind the registry (when trainer.sft and trainer.builders named each task):
# the same samples, seeds and flawed demonstrations, byte for byte.
DEMONSTRATIONS = {
    "arithmetic": (None, [], "1e5b2d83150857c2"),
    "arithmetic-no_tool": ("examples/calculator/sft.yaml", [], "4d8c445967f675fc"),
    "arithmetic-truncate": (None, ["sft.habit=truncate", "sft.habit_phrasings=[Compute]", "sft.habit_fraction=0.5",
                                   "seed=3", "data.seed=2"], "1412670d3ecc31bd"),
    "key_chain": ("examples/key_chain/sft.yaml", [], "778326c8b8ea0f63"),
    "key_chain-wrong": (None, ["data.task=key_chain", "sft.wrong_fraction=0.3", "seed=1"], "c0b00edb8d2ae505"),
    "wiki_qa": ("examples/retrieval_qa/sft.yaml", [], "ca1391a9a4580d21"),
    "wiki_qa-wrong": (None, ["data.task=wiki_qa", "sft.wrong_fraction=0.5", "seed=2"], "348ac257b531be27"),
}
SAMPLES = {
    ("arithmetic", 0): "169ea9c9c27a3055", ("arithmetic", 3): "0ccbc4acc382d0d6",
    ("key_chain", 0): "a238bb78fdfd5bf5", ("key_chain", 3): "d3d9af35b3924473",
    ("key_chain_long", 0): "af908580e5a1c4eb", ("key_chain_long", 3): "3992df2390c4201b",
    ("wiki_qa", 0): "563ce6fbd5aa5720", ("wiki_qa", 3): "563ce6fbd5aa5720",
    ("scienceworld", 0): "e845fcae7fa7025b", ("scienceworld", 3): "c7d5ab2b882d203b",
}


@pytest.mark.parametrize("name", list(DEMONSTRATIONS))
def test_the_built_in_demonstrations_are_the_same_as_before_the_registry(name: str) -> None:
    path, overrides, expected = DEMONSTRATIONS[name]
    config = load_config(ROOT / path if path else None, ["sft.num_demos=500", *overrides])
    assert fingerprint(demonstration_conversations(config)) == expected


@pytest.mark.parametrize(("task", "seed"), list(SAMPLES))
def test_the_built_in_samples_are_the_same_as_before_the_registry(task: str, seed: int) -> None:
    config = load_config(None, [f"data.task={task}", "data.train_size=300", "data.eval_size=50", f"data.seed={seed}"])
    assert fingerprint(load_samples(config)) == SAMPLES[task, seed]


def test_every_built_in_task_is_known_to_the_config_and_names_tools_and_a_reward_that_import() -> None:
    assert set(BUILTIN_TASKS) == set(task_names()) >= {"arithmetic", "key_chain", "key_chain_long", "wiki_qa",
                                                       "scienceworld"}
    for task in tasks():
        assert task.title and task.tools
        for spec in task.tools:
            assert callable(import_object(spec, f"{task.name}'s tool"))
        assert callable(import_object(task.reward, f"{task.name}'s reward"))


def test_an_unknown_task_is_refused_with_the_names_of_the_known_ones() -> None:
    with pytest.raises(UnknownTask, match="unknown task 'nonesuch'; the known tasks are arithmetic, code_repair, key_chain"):
        get_task("nonesuch")
    with pytest.raises(FileNotFoundError, match="neither a known task") as caught:
        load_samples(load_config(None, ["data.task=nonesuch"]))
    assert all(name in str(caught.value) for name in task_names())


def test_a_second_task_of_a_registered_name_is_refused() -> None:
    arithmetic = get_task("arithmetic")
    assert register(arithmetic) is arithmetic  # registering the same task again changes nothing
    with pytest.raises(ValueError, match="'arithmetic' is already registered"):
        register(Task(name="arithmetic", title="another", samples=lambda split, n, seed: [], tools=(), reward=""))


# A task defined here, as a user's module would: doubling a number with the calculator.
def doubling_samples(split: str, n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(f"doubling:{split}:{seed}")
    numbers = [rng.randint(100, 999) for _ in range(n)]
    return [{"id": f"{split}-{seed}-{i}", "question": f"What is twice {x}?", "expression": f"{x}*2",
             "answer": str(2 * x)} for i, x in enumerate(numbers)]


def doubling_demonstrations(n: int, seed: int, flaws: Flaws) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    if flaws.habit_phrasings:
        raise FlawError("habit_phrasings", "habit_phrasings: the doubling demonstrator has no habits")
    samples = doubling_samples("sft", n, seed)
    rng = flaws.rng()
    _, wrong = flaws.pick(samples, rng)
    pairs = []
    for i, s in enumerate(samples):
        answer = str(int(s["answer"]) + 1) if i in wrong else s["answer"]
        call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "' + s["expression"] + '"}}\n</tool_call>'
        pairs.append((s, [{"role": "user", "content": s["question"]}, {"role": "assistant", "content": call},
                          {"role": "tool", "content": s["answer"], "name": "calculator"},
                          {"role": "assistant", "content": f"The answer is {answer}."}]))
    return pairs


DOUBLING = Task(name="doubling", title="Double a number with the calculator (a test's own task)",
                samples=doubling_samples, tools=("agentfly.tools.builtin.calculator:calculator",),
                reward="agentfly.rewards.builtin.math:math_equal", demonstrations=doubling_demonstrations)


@pytest.fixture
def doubling(monkeypatch: pytest.MonkeyPatch) -> Task:
    monkeypatch.setattr(base, "_TASKS", dict(base._TASKS))  # the registry as it was, once the test ends
    return register(DOUBLING)


def doubling_config(*overrides: str) -> Any:
    return load_config(None, ["data.task=doubling", "data.train_size=40", "data.eval_size=4",
                              f"rollout.tools={json.dumps(list(DOUBLING.tools))}", f"rollout.reward={DOUBLING.reward}",
                              *overrides])


def test_a_task_registered_outside_the_trainer_gives_its_samples_and_flawed_demonstrations(doubling: Task) -> None:
    train, held_out = load_samples(doubling_config())
    assert train == doubling_samples("train", 40, 0) and held_out == doubling_samples("test", 4, 0)
    pairs = demonstration_conversations(doubling_config("sft.num_demos=40", "sft.wrong_fraction=0.25"))
    assert sum(m[-1]["content"] != f"The answer is {s['answer']}." for s, m in pairs) == 10
    # A habit it does not have is refused when the config is read (its Task.habits), and by the task itself.
    with pytest.raises(ConfigError, match=r"sft\.habit='no_tool' is not a habit of the doubling task's "
                                          r"demonstrator; its habits: none") as caught:
        doubling_config("sft.habit_phrasings=[What]")
    assert caught.value.key == "sft.habit"
    with pytest.raises(FlawError, match="the doubling demonstrator has no habits"):
        doubling.demonstrations(4, 0, Flaws(habit_phrasings=("What",)))


def test_a_task_without_demonstrations_asks_for_a_file_naming_the_tasks_that_have_them(doubling: Task) -> None:
    register(Task(name="undemonstrated", title="no demonstrations", samples=doubling_samples, tools=DOUBLING.tools,
                  reward=DOUBLING.reward))
    with pytest.raises(ConfigError, match=r"generated for 'arithmetic', .*'doubling'.* only; give a JSONL") as caught:
        demonstration_conversations(load_config(None, ["data.task=undemonstrated"]))
    assert caught.value.key == "sft.demos_path"
    assert "'undemonstrated'" not in str(caught.value).partition("generated for")[2]


def test_a_task_registered_outside_the_trainer_warm_starts_through_sft(doubling: Task, tiny_model_dir: Path,
                                                                       tmp_path: Path) -> None:
    from trainer.sft import run_sft

    config = doubling_config(f"model.path={tiny_model_dir}", "sft.num_demos=8", "sft.epochs=1", "sft.batch_size=4",
                             "sft.wrong_fraction=0", f"output_dir={tmp_path}", "threads=1", "eval.max_new_tokens=24")
    result = run_sft(config)
    assert result["state"] == "succeeded" and result["step"] == 2
    assert 0.0 <= result["metrics"]["eval/accuracy"] <= 1.0 and result["metrics"]["sft/demonstrations"] == 8.0
    assert (Path(result["path"]) / "config.yaml").is_file()


def test_a_habit_the_tasks_demonstrator_does_not_have_is_refused_when_the_config_is_read() -> None:
    with pytest.raises(ConfigError, match=r"sft\.habit='early_answer' is not a habit of the arithmetic task's "
                                          r"demonstrator; its habits: 'no_tool' and 'truncate'") as caught:
        load_config(None, ["sft.habit=early_answer", "sft.habit_phrasings=[Compute]"])
    assert caught.value.key == "sft.habit"
    assert load_config(None, ["data.task=key_chain", "sft.habit=early_answer",
                              "sft.habit_phrasings=[Follow]"]).sft.habit == "early_answer"
