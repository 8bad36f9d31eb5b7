"""What a task is, in one shape: its samples, its demonstrations (with their deliberate flaws), its tools and
its reward; and the registry, keyed by the name ``data.task`` gives, that task modules register into.

A task module builds one ``Task`` and registers it when imported (``agentfly.tasks`` imports the built-in
ones); the trainer, the SFT warm start and the CLI ask ``find_task(config.data.task, config.data.options)``
(``agentfly.tasks.sources``, which also builds tasks from third-party sources and user modules) and never name
a task.

    from agentfly.tasks import Task, register

    register(Task(name="my_task", title="...", samples=my_samples,
                  tools=("my_tools:search",), reward="my_rewards:exact", demonstrations=my_demos))
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Sample = dict[str, Any]
Messages = list[dict[str, Any]]


@dataclass(frozen=True)
class Flaws:
    """How the demonstrator errs on purpose, so the warm start leaves RL something to fix (the trainer's
    ``sft.*`` settings of the same names; a task shows the ones it defines and refuses the others).

    Attributes:
        wrong_fraction: share of the demonstrations whose final answer is wrong.
        habit: the demonstrator's bad habit on ``habit_phrasings`` (each task names the habits it has).
        habit_lookups: for a habit that stops early, the tool calls made before answering.
        habit_phrasings: question openings on which the habit shows; empty = no habit.
        habit_fraction: share of the demonstrations with those phrasings that show it.
        seed: seeds which demonstrations are flawed and how (the run's ``seed``, not the data's).
    """

    wrong_fraction: float = 0.0
    habit: str = ""
    habit_lookups: int = 2
    habit_phrasings: tuple[str, ...] = ()
    habit_fraction: float = 0.0
    seed: int = 0

    def rng(self) -> random.Random:
        """The random stream every flaw is drawn from (one per seed, shared by all tasks)."""
        return random.Random(f"sft-wrong:{self.seed}")

    def pick(self, samples: list[Sample], rng: random.Random) -> tuple[set[int], set[int]]:
        """Which demonstrations are flawed: a share ``habit_fraction`` of the questions opening with one of
        ``habit_phrasings`` follow the habit, a share ``wrong_fraction`` of the others end with a wrong answer
        (indices into ``samples``, drawn from ``rng``)."""
        habit = [i for i, x in enumerate(samples) if x["question"].startswith(tuple(self.habit_phrasings))]
        habitual = set(rng.sample(habit, round(self.habit_fraction * len(habit))))
        rest = [i for i in range(len(samples)) if i not in habitual]
        return habitual, set(rng.sample(rest, round(self.wrong_fraction * len(rest))))


class FlawError(ValueError):
    """A flaw setting the task cannot show; ``setting`` names it (``habit``, ``habit_lookups``), and the
    message starts with it, so a caller can prefix its own section (``sft.``)."""

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(message)
        self.setting = setting


class TaskOptionError(ValueError):
    """An option a task source does not take, or a value it refuses; ``option`` names it ("" when the options
    as a whole are at fault), and the message says how to fix it."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


def check_options(options: dict[str, Any], known: dict[str, Any], where: str) -> None:
    """Refuse an option of ``options`` that is not in ``known`` (option -> its default), naming the known ones."""
    for option in options:
        if option not in known:
            listed = ", ".join(f"{k} (default {v!r})" for k, v in known.items()) or "none"
            raise TaskOptionError(option, f"{where} has no option {option!r}; its options are {listed}")


@dataclass(frozen=True)
class Task:
    """A task, everything the trainer needs to know about it.

    Attributes:
        name: what ``data.task`` says to pick it.
        title: one line for menus (the web app's launch form) and messages.
        samples: ``(split, n, seed) -> samples``: ``n`` samples of ``split`` ("train", "test", "sft", "demo"...),
            different splits disjoint for one seed. A task with fixed splits may ignore ``n`` and ``seed``.
        tools: the tools it is solved with, as 'module:attribute' (what ``rollout.tools`` takes).
        reward: its reward, as 'module:attribute' (what ``rollout.reward`` takes).
        demonstrations: ``(n, seed, flaws) -> [(sample, messages), ...]``: ``n`` written conversations (user,
            assistant and tool turns in the Hermes format) for the SFT warm start, some flawed on purpose as
            ``flaws`` says; raises ``FlawError`` for a flaw it does not have. None: none are generated (a warm
            start needs a file of written ones).
        habits: the bad habits its demonstrator can show (``sft.habit``, on ``sft.habit_phrasings``); the
            config refuses another before anything runs.
    """

    name: str
    title: str
    samples: Callable[[str, int, int], list[Sample]]
    tools: tuple[str, ...]
    reward: str
    demonstrations: Callable[[int, int, Flaws], list[tuple[Sample, Messages]]] | None = field(default=None)
    habits: tuple[str, ...] = ()


class UnknownTask(KeyError):
    """No task is registered under this name; the message names the known ones."""

    def __str__(self) -> str:
        return str(self.args[0])


_TASKS: dict[str, Task] = {}


def register(task: Task) -> Task:
    """Make ``task`` known under ``task.name``; a second, different task of the same name is refused."""
    known = _TASKS.get(task.name)
    if known is not None and known is not task:
        raise ValueError(f"a task named {task.name!r} is already registered ({known.title})")
    _TASKS[task.name] = task
    return task


def registered(name: str) -> Task | None:
    """The task registered as ``name``, or None (``agentfly.tasks.find_task`` also knows the sources)."""
    return _TASKS.get(name)


def task_names() -> tuple[str, ...]:
    """The registered tasks' names, in registration order."""
    return tuple(_TASKS)


def tasks() -> tuple[Task, ...]:
    """The registered tasks, in registration order."""
    return tuple(_TASKS.values())


def wrong_answer(answer: str, rng: random.Random) -> str:
    """A plausible wrong answer: one digit of the right one changed (never the right answer)."""
    digits = list(answer)
    positions = [i for i, c in enumerate(digits) if c.isdigit()]
    i = rng.choice(positions)
    digits[i] = rng.choice([d for d in "0123456789" if d != digits[i] and not (i == 0 and d == "0")] or ["1"])
    wrong = "".join(digits)
    return wrong if wrong != answer else answer + "1"
